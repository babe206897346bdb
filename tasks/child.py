"""Parent side of the per-run child process: launch, relay its progress, read its result."""

import json
import os
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

from tasks.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


class ChildFailed(RuntimeError):
    """The child process crashed; the message carries the tail of its output."""


def device_env(device: str) -> dict[str, str]:
    """Environment a child needs for its device, set before any framework import."""
    env: dict[str, str] = {}
    if device == "xla":
        env["PJRT_DEVICE"] = os.environ.get("PJRT_DEVICE", "TPU")
    return env


def run_child(kind: str, job: dict, log, env: dict[str, str] | None = None) -> dict:
    """Run ``tasks.worker kind`` on ``job`` in a fresh interpreter; return its result dictionary.

    Raises UserError with the child's one-line message for bad input or a missing device, and
    ChildFailed with the tail of its output for a crash.
    """
    with tempfile.TemporaryDirectory(prefix="karman-job-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), child_env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "tasks.worker", kind, str(job_path), str(result_path)]
        tail: deque[str] = deque(maxlen=30)
        with subprocess.Popen(cmd, cwd=os.getcwd(), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip()
                if line:
                    tail.append(line)
                    log.info("[%s] %s", kind, line)
            rc = proc.wait()
        if rc == 3:
            message = next((l[len("error: "):] for l in reversed(tail) if l.startswith("error: ")), "bad input")
            raise UserError(message)
        if rc != 0:
            raise ChildFailed(f"{kind} child exited with code {rc}:\n" + "\n".join(tail))
        return json.loads(result_path.read_text())
