"""Warm children: a job's process forked from a server that has already imported the libraries every job imports.

A training or inference child spends most of a short run importing: torch 1.5–2.5 s of CPU, MLflow and its SQL store
2–3 s, zarr, xarray and pandas about 1 s, ``torch._dynamo`` (every torch optimizer imports it) 1–2 s. A flow that runs
many children (a benchmark's cells, a sweep's batch sizes, one rollout per cell) pays that once per child. Here a fork
server per kind of job (multiprocessing's forkserver, one per preload list, started on first use and gone with this
process) imports those libraries once; each child is forked from it and is then a job process like any other: its own
environment (set before any framework import: the frameworks themselves are preloaded only where their import reads none
of it (torch for torch's jobs, whose settings read at import are re-applied below), or reads only what the framework's cpu
environment fixes (TensorFlow and JAX for their cpu jobs, a server per set of those values)), its own folder, its output on a pipe this process reads
line by line, its exit code, signals and verdicts as before (tasks.common.process.job_main), the kernel's SIGTERM when the
fork server (and so this process) dies. ``ForkedChild`` answers as much of ``subprocess.Popen`` as the launcher uses.

A job of several processes on this host (DDP's ranks, TF_CONFIG workers) is a ``ForkedGroup``: each process forked from
the same server with the environment the framework's launcher would give it (the framework table's ``rank_env``), their
output on one pipe, and the launcher's rules kept: a process that fails stops the others, a signal goes to each, the
group's exit code is the first failure's. Jobs over several hosts (srun) start as before.
``KARMAN_WARM_CHILDREN=0`` starts every child as a fresh interpreter, several under the framework's launcher.
"""

import io
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import connection, context, forkserver, get_context, process, reduction
from pathlib import Path

WARM_ENV = "KARMAN_WARM_CHILDREN"

# What every job imports, none of which reads the job's environment at import; a framework's jobs add what the framework
# table lets its server preload (torch's). The job's entry module comes first: the server's command line (and so each
# forked job's, as ps and psutil show it) names it; then the cycle collector goes off for the rest (tasks.common.process.collector).
COMMON = ("tasks.common.process.job_main", "tasks.common.process.collector_off", "numpy", "pandas", "xarray", "zarr", "psutil", "pydantic", "mlflow", "mlflow.tracking",
          "mlflow.store.tracking.sqlalchemy_store", "matplotlib", "matplotlib.figure", "tasks.common.process.job_preload")
# The last, after the framework's: everything the server imported frozen (its own end then costs a fraction of a second).
FROZEN = "tasks.common.process.collector_frozen"
_servers: dict[tuple, forkserver.ForkServer] = {}
_lock = threading.Lock()


def warm_enabled(procs: int, hosts: int, framework: str) -> bool:
    """Whether a job of ``procs`` processes on ``hosts`` hosts is forked: on this host, one process or a framework whose
    table entry gives each of several their environment."""
    if hosts != 1 or os.environ.get(WARM_ENV, "1") == "0" or sys.platform != "linux":
        return False
    from tasks.common.config.frameworks import FRAMEWORKS

    return procs == 1 or FRAMEWORKS[framework].rank_env is not None


def start_early(framework: str, procs: int, hosts: int, env: dict[str, str]) -> bool:
    """Start now the server that a job of ``procs`` processes of ``framework`` on ``hosts`` hosts, whose environment adds
    ``env`` to this process's (its plan's ``child_env``), will be forked from, so that it imports while the command goes on
    (its Prefect API, its MLflow run) instead of after the job is launched; whether it did. The server is the one
    ``_server`` gives the job later (TensorFlow's and JAX's cpu servers are keyed by the job's import-time variables, which
    ``env`` holds); it ends with this process, as every server does."""
    if not warm_enabled(procs, hosts, framework):
        return False
    _server(framework, {**os.environ, **env}).ensure_running()  # spawns it and returns: its imports run in its own process
    return True


def _preload(framework: str, env: dict[str, str]) -> tuple[tuple[str, ...], tuple]:
    """The modules a warm server for a ``framework`` job of environment ``env`` imports, and what else tells servers apart:
    a cpu job whose import-time variables are those the framework's cpu environment gives (with this process's own
    environment, which the server inherits) also takes the framework's ``cpu_preload``, the server keyed by those values."""
    from tasks.common.config.frameworks import FRAMEWORKS

    fw = FRAMEWORKS[framework]
    preload = (*COMMON, *fw.preload)  # frameworks that preload nothing share one server
    if fw.cpu_preload:
        def reads(e):
            return tuple(sorted((k, v) for k, v in e.items() if k.startswith(fw.import_env)))

        cpu = reads({**os.environ, **fw.env("cpu", None)})
        if reads(env) == cpu:
            return (*preload, *fw.cpu_preload, FROZEN), cpu
    return (*preload, FROZEN), ()


def _server(framework: str, env: dict[str, str]) -> forkserver.ForkServer:
    key = _preload(framework, env)
    with _lock:
        server = _servers.get(key)
        if server is None:
            importable_in_servers()
            server = _servers[key] = forkserver.ForkServer()
            server.set_forkserver_preload(list(key[0]))
        return server


def importable_in_servers() -> None:
    """A fork server (a warm server here, a sweep's Dask workers' in tasks.common.process.cluster) imports its preload with the
    path of a new interpreter in this process's folder (multiprocessing sends it this process's sys.path, which Python
    3.11's server never applies), and skips a module it cannot import without a word: a command run from another folder
    would get servers without this project's modules (the job's entry, a framework's preload, a sweep's tasks, the last
    preload that freezes the rest). This project's root goes on PYTHONPATH, which the servers inherit, as it does for
    every job."""
    root = str(Path(__file__).resolve().parents[3])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def _child(argv: list[str], env: dict[str, str], cwd: str) -> None:
    """In the forked process: become the job process ``python -m tasks.common.process.job_main ARGV`` would have been."""
    from tasks.common.process.collector import settle

    settle()  # the server's imports frozen, never walked by this job's collections; the collector on, as in any process
    out = forkserver.get_inherited_fds()[0]
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    # line by line, each line in one write (job_main.main says why), through a buffer that writes all it is given
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), line_buffering=True)
    from tasks.common.process.lifetime import PARENT_ENV, exit_status

    os.environ.clear()
    os.environ.update(env)
    os.environ[PARENT_ENV] = str(os.getppid())  # the fork server, whose end (this process's parent's) ends it
    os.chdir(cwd)
    for path in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]):
        sys.path.insert(0, path)
    sys.argv = [sys.argv[0], *argv]
    _fresh_process_state(env)
    code = 1
    try:
        from tasks.common.process import job_main

        code = job_main.main(argv)
    except SystemExit as exc:
        code = exit_status(exc)
    finally:
        import atexit

        atexit._run_exitfuncs()  # as an interpreter's end would: MLflow's and the libraries' own handlers
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _fresh_process_state(env: dict[str, str]) -> None:
    """What a new interpreter would have that a fork shares with its server: random seeds, and torch's thread count
    (OpenMP reads OMP_NUM_THREADS when torch is loaded, which here was in the server)."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        threads = env.get("OMP_NUM_THREADS", "")
        torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else len(os.sched_getaffinity(0)))


class ForkedChild:
    """A job process forked from a warm server, with the part of ``subprocess.Popen`` the launcher and
    ``tasks.common.process.lifetime.stop_child`` use: ``pid``, ``stdout`` (text, the child's stdout and stderr), ``poll``,
    ``wait``, ``send_signal``, ``kill``, ``returncode``, a context manager."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, framework: str, out: int | None = None,
                 server_env: dict[str, str] | None = None):
        """``out``: a pipe's write end the child writes to (a group's, which the group closes) instead of one of its own;
        ``server_env``: the environment that chooses its server, where ``env`` adds what the framework reads later."""
        self.returncode: int | None = None
        self._lock = threading.Lock()
        self._fds: list[int] = []
        read, write = (None, out) if out is not None else os.pipe()
        try:
            self._fds.append(write)
            proc = get_context("forkserver").Process(target=_child, args=(argv, env, cwd), name=f"job-{argv[0]}", daemon=False)
            # the child needs only where to find modules and its folder; not the parent's __main__ (a command's
            # would import Prefect and the CLI into every job)
            prep = {"sys_path": list(sys.path), "dir": cwd, "authkey": bytes(process.current_process().authkey)}
            buf = io.BytesIO()
            context.set_spawning_popen(self)
            try:
                reduction.dump(prep, buf)
                reduction.dump(proc, buf)
            finally:
                context.set_spawning_popen(None)
            self._status, data = _server(framework, server_env or env).connect_to_new_process(self._fds)
            with open(data, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = forkserver.read_signed(self._status)
        finally:
            if out is None:
                os.close(write)
        self.stdout = None if read is None else io.TextIOWrapper(io.FileIO(read, "r", closefd=True), errors="replace")
        self.args = argv

    def duplicate_for_child(self, fd: int) -> int:  # multiprocessing's spawning-popen protocol (fds sent to the server)
        self._fds.append(fd)
        return len(self._fds) - 1

    def poll(self) -> int | None:
        return self._wait(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def _wait(self, timeout: float | None) -> int | None:
        """The exit code once the server has said it (it reaps the child), else None after ``timeout`` s; safe
        from several threads (the launcher's relay and a stopper wait at once)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 0.2 if deadline is None else min(0.2, max(deadline - time.monotonic(), 0.0))
            if connection.wait([self._status], left):
                with self._lock:
                    if self.returncode is None:
                        try:
                            self.returncode = forkserver.read_signed(self._status)  # as Popen: -N for death by signal N
                        except (OSError, EOFError):
                            self.returncode = 255  # the server died before it could say
            elif deadline is not None and time.monotonic() >= deadline:
                break
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.stdout is not None:
            self.stdout.close()
        self.wait()
        os.close(self._status)


class ForkedGroup:
    """A job's ``len(envs)`` processes on this host, each forked from a warm server with its own environment (``envs``, rank
    0 first), as ``ForkedChild`` answers for one: one ``stdout`` for all of them, ``poll`` and ``wait`` for the last,
    ``send_signal`` and ``kill`` to each. As a launcher would: once one process has failed by itself, the others are stopped
    (SIGTERM, SIGKILL after ``grace_s``: they would wait for it in their next collective), and the group's exit code and
    ``failed_rank`` are that failure's (the lowest rank's of those seen ending at once); otherwise the first nonzero code in
    rank order, else 0. ``pid`` is rank 0's."""

    def __init__(self, argv: list[str], envs: list[dict[str, str]], cwd: str, framework: str, server_env: dict[str, str], grace_s: float = 10.0):
        self.returncode: int | None = None
        self.args, self._grace_s = argv, grace_s
        self.failed_rank: int | None = None  # the first process that failed by itself while the others ran
        self._signalled = False  # a signal sent to the group: its processes are ending, none has failed the others
        self.children: list[ForkedChild] = []
        read, write = os.pipe()
        try:
            for env in envs:
                self.children.append(ForkedChild(argv, env, cwd, framework, out=write, server_env=server_env))
        except BaseException:
            self._signal(signal.SIGKILL)  # those started
            os.close(read)
            raise
        finally:
            os.close(write)
        self.stdout = io.TextIOWrapper(io.FileIO(read, "r", closefd=True), errors="replace")
        self.pid = self.children[0].pid
        self._ended = threading.Event()
        threading.Thread(target=self._watch, name="forked-group", daemon=True).start()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _watch(self) -> None:
        """In a thread of its own (the caller reads the group's output meanwhile, which ends only with the last process):
        the processes' ends; once one has failed, the others stopped; the group's code once all have ended."""
        while None in (codes := [child.poll() for child in self.children]):
            if self.failed_rank is None and not self._signalled and any(c not in (None, 0) for c in codes):
                self.failed_rank = next(r for r, c in enumerate(codes) if c not in (None, 0))  # its code is the group's
                self._signal(signal.SIGTERM)
                stop_by = time.monotonic() + self._grace_s
            elif self.failed_rank is not None and time.monotonic() > stop_by:
                self._signal(signal.SIGKILL)
            time.sleep(0.1)
        self.returncode = codes[self.failed_rank] if self.failed_rank is not None else next((c for c in codes if c != 0), 0)
        self._ended.set()

    def send_signal(self, signum: int) -> None:
        """``signum`` to each process: the group's processes then end as that signal makes them, each in its own time (a
        stop at the end of a step: rank 0 closes the run after the others have gone), none stopped for ending first."""
        self._signalled = True
        self._signal(signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        for child in self.children:
            child.send_signal(signum)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stdout.close()
        self.wait()
        for child in self.children:
            child.__exit__()

