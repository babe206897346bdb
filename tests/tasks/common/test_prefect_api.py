"""Prefect's temporary API started ahead of a command's flow: up once joined, stopped with a process that ends first.

None starts where a server is named."""

import os
import subprocess
import sys

import psutil

from tests.conftest import ROOT

SCRIPT = r"""
import sys
import httpx
from prefect.server.api.server import SubprocessASGIServer
from tasks.common.process.prefect_api import temporary_api_started

popen = SubprocessASGIServer._run_uvicorn_command
def run_and_say(self):  # the server's process, named as it starts
    proc = popen(self)
    print("server", proc.pid, flush=True)
    return proc
SubprocessASGIServer._run_uvicorn_command = run_and_say
starting = temporary_api_started()
assert starting is not None and not starting.daemon
if sys.argv[1] == "join":
    starting.join()
    server = SubprocessASGIServer()
    print("up", httpx.get(server.api_url + "/health").status_code, flush=True)
# else: the process ends at once, the start under way
"""


def _left(home: str) -> list[psutil.Process]:
    """Servers of this test's Prefect home still running."""
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "prefect.server.api.server:create_app" in " ".join(proc.info["cmdline"] or ()) and proc.environ().get("PREFECT_HOME") == home:
                left.append(proc)
        except psutil.Error:
            pass
    return left


def test_the_temporary_api_is_up_once_joined_and_stopped_with_a_process_that_ends_before(tmp_path):
    home = str(tmp_path / "prefect-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({"PREFECT_HOME": home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT)})
    for how in ("join", "exit"):
        done = subprocess.run([sys.executable, "-c", SCRIPT, how], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = dict(line.split() for line in done.stdout.splitlines())
        assert "server" in lines and (how == "exit" or lines.get("up") == "200"), (how, done.stdout)  # started in both; answered once joined
        server = int(lines["server"])  # stopped by Prefect's exit handler, the start having gone through before it
        assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE, how
        assert _left(home) == [], how


def test_no_temporary_api_where_a_server_is_named():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.common.process.prefect_api import temporary_api_started

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert temporary_api_started() is None
