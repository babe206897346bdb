"""Process lifetime: children die with their parent, signals unwind a command cleanly, and a guardian stops what a killed command leaves behind."""

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

from tasks.common.config.errors import Interrupted
from tasks.common.config.settings import Settings

PR_SET_PDEATHSIG = 1
GRACE_S = float(os.environ.get("KARMAN_STOP_GRACE_S", "30"))  # how long a signalled child may take to stop
_stop = threading.Event()  # set in a child job when it is asked to stop (see request_stop_on_signals)


PARENT_ENV = "KARMAN_PARENT_PID"  # set by the launching process for its direct child
JOB_DIR_PREFIX = "karman-job-"  # + the launching process's pid: the job's temporary folder
_pending: list[BaseException] = []  # a signal that arrived while a child was finishing its run anyway


def die_with_parent() -> None:
    """In a child, first thing: the kernel sends it SIGTERM when its parent dies, however the parent dies
    (Linux; elsewhere nothing). A parent that died before this call is caught by comparing pids."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    expected = os.environ.get(PARENT_ENV)
    if expected and expected.isdigit() and os.getppid() != int(expected) and os.environ.get("LOCAL_RANK") is None:
        os.kill(os.getpid(), signal.SIGTERM)


def defer(exc: BaseException) -> None:
    """Keep a signal's exception for later: the child it was meant for finished its run first."""
    _pending.append(exc)


def raise_pending() -> None:
    """Raise a signal's exception kept by ``defer``, once: as Interrupted where a signal is behind it (Prefect's
    TerminationSignal included), so that the command's ending names it."""
    if _pending:
        exc = _pending.pop()
        signum = signal_of(exc)
        if signum is not None and not isinstance(exc, (Interrupted, KeyboardInterrupt)):
            raise Interrupted(signum) from exc
        raise exc


_received: list[int] = []  # the signals this command was sent
_forwards: list = []  # while a child runs (forwarding_to): how to pass it a signal whose exception was swallowed


def raise_on_sigterm() -> None:
    """In a command's main thread: SIGTERM raises Interrupted there, and SIGINT KeyboardInterrupt, even
    where the command was started with SIGINT ignored (a background job of a script inherits that)."""
    def handler(signum, frame):
        _received.append(signum)
        raise Interrupted(signum)

    def interrupt(signum, frame):
        _received.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, interrupt)
    keep_swallowed_signals()


def keep_swallowed_signals() -> None:
    """A handler's exception (ours above; Prefect's TerminationSignal while a flow runs) is raised wherever the main
    thread happens to be. Where Python cannot pass it on (a ``__del__`` the garbage collector runs, a weakref
    callback: "Exception ignored in ...") the stop would be lost and the command would run on. Kept here instead:
    noted as received, passed at once to the child that is running (its run stops after its step, as if signalled
    directly), and raised by ``raise_pending`` before the next child starts or when the flow ends."""
    previous = sys.unraisablehook
    if getattr(previous, "keeps_signals", False):
        return

    def hook(unraisable):
        signum = signal_of(unraisable.exc_value)
        if signum not in (signal.SIGTERM, signal.SIGINT):
            previous(unraisable)
            return
        _received.append(signum)
        defer(unraisable.exc_value)
        for forward in list(_forwards):
            forward(signum)

    hook.keeps_signals = True
    sys.unraisablehook = hook


class forwarding_to:
    """``with forwarding_to(proc):`` a signal this command's handlers could not raise (keep_swallowed_signals) goes
    on to ``proc`` (``send_signal``) while the block runs."""

    def __init__(self, proc):
        self._forward = proc.send_signal

    def __enter__(self):
        _forwards.append(self._forward)
        return self

    def __exit__(self, *exc):
        _forwards.remove(self._forward)
        return False


def received() -> int | None:
    """The last signal this command was sent (through ``raise_on_sigterm``, or noted by ``note_signal``), or None."""
    return _received[-1] if _received else None


def note_signal(signum: int) -> None:
    """Note ``signum`` as sent to this command where another handler raised its exception (Prefect's TerminationSignal
    while a flow runs), so that a benchmark starts no further cell and the command ends with 128 + it."""
    if received() != signum:
        _received.append(signum)


def exit_status(exc: SystemExit) -> int:
    """The status an interpreter ending on ``exc`` exits with: 0 for ``sys.exit()``, its number, else 1 (a message)."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def signal_of(exc: BaseException | None) -> int | None:
    """The signal behind an exception or the ones it was raised from: Interrupted, Prefect's
    TerminationSignal, KeyboardInterrupt (SIGINT); None if no signal."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for attr in ("signum", "signal"):
            if isinstance(getattr(exc, attr, None), int):
                return int(getattr(exc, attr))
        if isinstance(exc, KeyboardInterrupt):
            return int(signal.SIGINT)
        exc = exc.__cause__ or exc.__context__
    return None


def request_stop_on_signals() -> None:
    """In a child job that can stop cleanly (training): SIGTERM and SIGINT only set a flag the job polls."""
    def handler(signum, frame):
        _stop.set()
        _stop.signum = signum

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def stop_requested() -> int | None:
    """The signal that asked this job to stop, or None."""
    return getattr(_stop, "signum", None) if _stop.is_set() else None


def stop_child(proc: subprocess.Popen, signum: int = signal.SIGTERM, grace_s: float = GRACE_S) -> None:
    """``signum`` (the one this process got: SIGTERM or SIGINT) to ``proc``; SIGKILL if it has not exited
    within ``grace_s`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signum)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------------------------
# The guardian: a small process of its own session that watches a command and, once the command is
# gone, stops every process the command had started and left running (its temporary Prefect server,
# Dask cluster, training children), first with SIGTERM, after a grace period with SIGKILL.

def _below(command: psutil.Process) -> dict[int, psutil.Process]:
    """pid -> process of every process below ``command`` now; empty once it is gone."""
    try:
        return {p.pid: p for p in command.children(recursive=True)}
    except psutil.NoSuchProcess:
        return {}


def guard(pid: int, every_s: float = 0.5, grace_s: float = 10.0, settings: Settings | None = None) -> None:
    """Watch ``pid``; when it is gone, stop the processes it had below it at the last look, remove its
    children's job folders and, with ``settings``, mark KILLED the runs it left RUNNING (``close_runs``). A
    process is known by its pid and start time (psutil's identity), so a pid reused since is never signalled."""
    try:
        command = psutil.Process(pid)
        argv = command.cmdline()
        what = " ".join([os.path.basename(argv[0]), *argv[1:4]]) if argv else command.name()  # python -m flows train
        what = " ".join(what.split())[:80]  # one short line
    except psutil.NoSuchProcess:
        command, what = None, "the command"
    left: dict[int, psutil.Process] = {}
    while command is not None and command.is_running():
        left = _below(command) | {p: proc for p, proc in left.items() if proc.is_running()}
        left.pop(os.getpid(), None)
        time.sleep(every_s)
    tracking = threading.Thread(target=_import_tracking, daemon=True)
    if settings is not None:
        tracking.start()  # MLflow's import takes seconds: made while the children stop

    def alive() -> list[psutil.Process]:
        return [proc for proc in left.values() if proc.is_running()]

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0)):
        for proc in alive():
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:  # ended (or its pid was reused) since the look
                pass
        deadline = time.monotonic() + wait_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.2)
    import glob
    import shutil
    import tempfile

    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{JOB_DIR_PREFIX}{pid}-*")):  # its children's job folders
        shutil.rmtree(folder, ignore_errors=True)
    if settings is not None:
        tracking.join()
        close_runs(settings, f"{what} (pid {pid}) was killed; its guardian closed the run")


def _import_tracking() -> None:
    import tasks.common.tracking.runs  # noqa: F401


def close_runs(settings: Settings, reason: str) -> list[str]:
    """After a command is gone and nothing it started runs any more: its RUNNING runs (and those of any
    other process on this host that ended without closing its runs, as the next command would find them)
    marked KILLED with ``reason``. A store that cannot be reached leaves them to the next command."""
    try:
        from tasks.common.tracking.runs import reap_orphans

        return reap_orphans(settings, reason=reason)
    except Exception:  # noqa: BLE001  (no one reads a guardian's errors; the next command reaps them)
        return []


def start_guardian(settings: Settings | None = None) -> subprocess.Popen:
    """A guardian for this process; with ``settings``, it also closes the runs this process leaves open
    in their tracking store when it is killed."""
    env = {**os.environ, **settings.child_env()} if settings is not None else None
    return subprocess.Popen([sys.executable, "-m", "tasks.common.process.lifetime", str(os.getpid()), *(["--close-runs"] if settings else [])],
                            start_new_session=True, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, close_fds=True)


if __name__ == "__main__":
    if "--close-runs" in sys.argv[2:]:
        guard(int(sys.argv[1]), settings=Settings.from_env())
    else:
        guard(int(sys.argv[1]))
