"""Servers as background processes: free ports on 127.0.0.1, waiting for a health URL, stopped together.

Used by the soak test (infra/soak.py) and by the test suite's real servers."""

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


class Services:
    """Background processes in their own sessions, each logging to a file; stopped together."""

    def __init__(self, folder: Path, env: dict):
        self.folder, self.env, self.procs = folder, env, []

    def start(self, name: str, args: list[str], extra_env: dict | None = None) -> tuple[subprocess.Popen, Path]:
        log = self.folder / f"{name}.log"
        proc = subprocess.Popen(args, cwd=ROOT, env={**self.env, **(extra_env or {})}, stdout=log.open("w"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
