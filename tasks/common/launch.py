"""Parent side of a child job (flow process): launch it, relay its progress, read its result."""

import json
import os
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

from tasks.common.errors import RunFailed, UserError

ROOT = Path(__file__).resolve().parents[2]


class ChildFailed(RuntimeError):
    """The child process crashed; the message carries the tail of its output."""


def device_env(device: str, world_size: int | None = None) -> dict[str, str]:
    """Environment a child needs for its device, set before any framework import. On the XLA CPU
    runtime (PJRT_DEVICE=CPU, for tests) ``world_size`` sets the number of virtual devices."""
    env: dict[str, str] = {}
    if device == "xla":
        env["PJRT_DEVICE"] = os.environ.get("PJRT_DEVICE", "TPU")
        if env["PJRT_DEVICE"] == "CPU" and world_size:
            env["CPU_NUM_DEVICES"] = str(world_size)
    return env


def run_child(kind: str, job: dict, log, env: dict[str, str] | None = None, procs: int = 1, on_line=None,
              framework: str = "torch") -> dict:
    """Run ``tasks.common.job_main kind`` on ``job`` with ``framework``'s job body in a fresh interpreter (``procs`` > 1: that many under
    torchrun, one per device); return its (rank 0's) result dictionary.

    Raises UserError with the child's one-line message for bad input or a missing device, RunFailed
    with its message for a run that failed for a stated reason, and ChildFailed with the tail of its
    output for a crash.
    """
    with tempfile.TemporaryDirectory(prefix="karman-job-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps({**job, "framework": framework}))
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), child_env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "tasks.common.job_main", kind, str(job_path), str(result_path)]
        if procs > 1:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"]
            cmd = launcher + cmd[1:]
        tail: deque[str] = deque(maxlen=30)
        with subprocess.Popen(cmd, cwd=os.getcwd(), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip()
                if line:
                    tail.append(line)
                    log.info("[%s] %s", kind, line)
                    if on_line is not None:
                        on_line(line)
            rc = proc.wait()
        if rc != 0:
            # Under torchrun the exit code is the launcher's; the rank's own line says what happened.
            for line in reversed(tail):
                if line.startswith("error: "):
                    raise UserError(line[len("error: "):])
                if line.startswith("failed: "):
                    raise RunFailed(line[len("failed: "):])
            raise ChildFailed(f"{kind} child exited with code {rc}:\n" + "\n".join(tail))
        return json.loads(result_path.read_text())
