"""Parent side of a child job (flow process): launch it, relay its progress, read its result."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path

from models.host import DeviceKind
from tasks.common.process import events
from tasks.common.config.errors import RunFailed, RunStopped, UserError, signal_name
from tasks.common.process.lifetime import (JOB_DIR_PREFIX, PARENT_ENV, defer, forwarding_to, note_signal, raise_pending, signal_of,
                                          stop_child)
from tasks.common.tracking.flowrun import flow_run_env
from tasks.common.config.frameworks import DEFAULT, FRAMEWORKS, free_ports
from tasks.common.process.warm import ForkedChild, ForkedGroup, warm_enabled

ROOT = Path(__file__).resolve().parents[3]


class ChildFailed(RuntimeError):
    """The child process crashed; the message says with what, in one line (its traceback is in the log)."""


# Lines TensorFlow's C++ runtime writes before its log level applies (absl's preamble, oneDNN and CPU
# feature notices, a cuInit that finds no GPU on a CPU host): kept in the tail, logged with --verbose only.
RUNTIME_NOISE = re.compile(r"^(?:[IWE]\d{4} [\d:.]+\s+\d+ [\w./-]+:\d+\] |WARNING: All log messages before absl::InitializeLog"
                           r"|To enable the following instructions: )")


def _relay(proc: subprocess.Popen, kind: str, tail: deque, verdicts: list, log, on_event) -> None:
    """The child's output, line by line, until it closes: log text into the log (once), structured
    events (tasks.common.process.events) to ``on_event``, verdict events kept in ``verdicts``."""
    from tasks.common.process.quiet import verbose

    loud = verbose()
    for line in proc.stdout:
        line = line.rstrip()
        if not line:
            continue
        event = events.parse(line)
        if event is not None:
            if event[events.KEY] == events.VERDICT:
                verdicts.append(event)
            elif on_event is not None:
                on_event(event)
            continue
        tail.append(line)
        if not loud and RUNTIME_NOISE.match(line):
            continue
        log.info("[%s] %s", kind, line)
    proc.wait()


def _raise_verdict(kind: str, rc: int, tail: deque, verdicts: list, result_path: Path, failed_rank: int | None = None) -> None:
    """Raise what the child's end means: its structured error (result file), else its last verdict event
    (under torchrun the exit code is the launcher's), else a crash described in one line. Where rank 0 only stopped
    because another rank had failed (``failed_rank``, or that rank's own verdict), that rank's failure is the job's."""
    def ranked(verdict: dict) -> dict:  # another rank's verdict, saying which rank's it is
        return {"kind": verdict["kind"], "message": f"rank {verdict['rank']}: {verdict['message']}"}

    error = None
    if result_path.is_file():
        error = json.loads(result_path.read_text()).get("error")
    if error is None:
        error = next((v for v in reversed(verdicts) if "rank" not in v), None)  # rank 0's
    if error is None or error["kind"] == "stopped":
        other = next((v for v in verdicts if v.get("rank") and v["kind"] != "stopped"), None)
        if other is not None:
            error = ranked(other)
        elif failed_rank and not any(v.get("rank") == failed_rank for v in verdicts):  # it ended without a word
            error = {"kind": "crash", "message": f"{kind} child rank {failed_rank} {_why(rc, None)}; the other ranks were stopped"}
    if error is None and verdicts:
        error = ranked(verdicts[-1])
    if error is None:
        error = {"kind": "crash", "message": f"{kind} child {_why(rc, tail)}"}
    cls = {"user": UserError, "failed": RunFailed, "stopped": RunStopped}.get(error["kind"], ChildFailed)
    raise cls(error["message"])


def _why(rc: int, tail: deque | None) -> str:
    """How a process that wrote no verdict ended, in words."""
    if rc < 0:
        return f"killed by {signal_name(-rc)}" + (" (by the kernel's out-of-memory killer, if nothing else sent it)" if rc == -9 else "")
    return f"exited with code {rc}" + (f": {tail[-1]}" if tail else "")


def device_env(device: DeviceKind, world_size: int | None = None, framework: str = DEFAULT) -> dict[str, str]:
    """Environment a child needs for its device, set before any framework import (the framework table's ``env``).
    On the XLA CPU runtime (PJRT_DEVICE=CPU, for tests) ``world_size`` sets the number of virtual devices."""
    return FRAMEWORKS[framework].env(device, world_size)


def launcher(framework: str, procs: int, hosts: int = 1, folder: str = "") -> list[str]:
    """The command that starts a job's processes before ``-m MODULE ARGS`` (the framework table's ``launcher``): python
    itself, torchrun (torch; its log folders in the job's ``folder``) or tasks.common.process.workers (tensorflow, a TF_CONFIG
    cluster on 127.0.0.1) on this host, or srun over the hosts of a SLURM allocation (torch: one task per host running
    torchrun; tensorflow: one per worker)."""
    return FRAMEWORKS[framework].launcher(procs, hosts, folder)


def run_child(kind: str, body: str, job: dict, log, env: dict[str, str] | None = None, procs: int = 1, on_event=None,
              framework: str = DEFAULT, hosts: int = 1) -> dict:
    """Run the job body ``body`` (``module:function``, registered by its stage) as a ``kind`` job on ``job``
    in a process of its own, forked from a warm server or a fresh interpreter (tasks.common.process.warm) (``procs`` > 1:
    that many, one per device, each with what torchrun gives torch's or a TF_CONFIG cluster tensorflow's; ``hosts``
    > 1: that many per host on the hosts of the SLURM allocation, see ``launcher``); return its (rank 0's) result dictionary. ``on_event`` receives
    the child's structured events (progress) as they come.

    Raises UserError with the child's one-line message for bad input or a missing device, RunFailed
    with its message for a run that failed for a stated reason, and ChildFailed with the tail of its
    output for a crash.
    """
    # the guardian removes it if this process is killed; over several hosts it lies in the working folder, which they share
    with tempfile.TemporaryDirectory(prefix=f"{JOB_DIR_PREFIX}{os.getpid()}-", dir=os.getcwd() if hosts > 1 else None) as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps({**job, "body": body, "framework": framework}))
        raise_pending()  # a signal that came while the previous child finished: stop before starting another
        # the flow run it works for, so that a run it opens or reports to links back to it
        child_env = {**os.environ, **flow_run_env(), **(env or {}), "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid())}
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), child_env.get("PYTHONPATH")]))
        cmd = launcher(framework, procs, hosts, tmp) + ["-m", "tasks.common.process.job_main", kind, str(job_path), str(result_path)]
        tail: deque[str] = deque(maxlen=30)
        verdicts: list[dict] = []
        args = [kind, str(job_path), str(result_path)]
        if warm_enabled(procs, hosts, framework):  # forked from a server that has imported what every job imports (tasks.common.process.warm)
            if procs == 1:
                started = ForkedChild(args, child_env, os.getcwd(), framework)
            else:  # the processes the framework's launcher would start, each with what it would give them
                ports, rank_env = free_ports(procs), FRAMEWORKS[framework].rank_env
                envs = [{**child_env, **rank_env(child_env, rank, procs, ports)} for rank in range(procs)]
                started = ForkedGroup(args, envs, os.getcwd(), framework, server_env=child_env)
        else:
            started = subprocess.Popen(cmd, cwd=os.getcwd(), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with started as proc, forwarding_to(proc):
            assert proc.stdout is not None
            try:
                _relay(proc, kind, tail, verdicts, log, on_event)
            except BaseException as exc:  # SIGTERM or Ctrl-C here: stop the child, then say how it ended
                forwarded = signal_of(exc) if signal_of(exc) in (signal.SIGTERM, signal.SIGINT) else signal.SIGTERM
                if signal_of(exc) is not None:  # Prefect's handler, not this command's, may have raised it: noted all the same
                    note_signal(signal_of(exc))
                stopper = threading.Thread(target=stop_child, args=(proc, forwarded), daemon=True)
                stopper.start()
                _relay(proc, kind, tail, verdicts, log, on_event)
                stopper.join()
                if proc.returncode == 0:  # it finished its run meanwhile: keep the run, stop the command after it
                    defer(exc)
                    return json.loads(result_path.read_text())
                _raise_verdict(kind, proc.returncode, tail, verdicts, result_path, getattr(proc, "failed_rank", None))
                raise RunStopped(f"{kind} {exc or type(exc).__name__}") from exc
            rc = proc.wait()
        if rc != 0:
            _raise_verdict(kind, rc, tail, verdicts, result_path, getattr(proc, "failed_rank", None))
        return json.loads(result_path.read_text())
