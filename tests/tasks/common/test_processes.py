"""Which process holds a run open (the driver tag) and the guardian that stops what a killed command left running."""

import os
import signal
import socket
import subprocess
import sys
import time

import psutil

from tasks.common.tracking.runs import driver_alive, driver_id
from tests.conftest import ROOT


def _proc_stat_start(pid: int) -> str:
    """The start field of /proc/PID/stat (clock ticks since boot), as tags written before psutil held it."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def test_a_driver_tag_names_this_process_as_the_kernel_counts_its_start():
    host, pid, start = driver_id().split(":")
    assert (host, int(pid)) == (socket.gethostname(), os.getpid())
    assert start == _proc_stat_start(os.getpid())  # so a tag written by an older version still matches
    assert driver_alive(driver_id()) is True
    assert driver_alive(f"{host}:{pid}:{_proc_stat_start(os.getpid())}") is True
    assert driver_alive(f"{host}:{pid}:?") is True


def test_a_driver_that_ended_or_whose_pid_was_reused_is_gone_and_another_host_is_unknown():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    tag = driver_id(child.pid)
    child.wait()
    assert driver_alive(tag) is False
    host, pid, start = driver_id().split(":")
    assert driver_alive(f"{host}:{pid}:{int(start) + 1}") is False  # the same pid, started at another time
    assert driver_alive(f"elsewhere-{host}:{pid}:{start}") is None
    assert driver_alive(f"{host}:not-a-pid:{start}") is None


def test_the_guardian_stops_what_a_killed_command_left_running_and_closes_its_runs(workdir):
    from mlflow.tracking import MlflowClient

    from tasks.common.config.settings import Settings
    from tasks.common.tracking.runs import experiment_id

    settings = Settings.from_env()
    client = MlflowClient(settings.tracking_uri)
    exp = experiment_id(client, settings)
    # the "command" starts a grandchild in its own session (as a server would be) and prints its pid
    script = ("import subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
              "print(p.pid, flush=True)\ntime.sleep(300)\n")
    command = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    left = psutil.Process(int(command.stdout.readline()))
    theirs = client.create_run(exp, tags={"karman.driver": driver_id(command.pid)}).info.run_id
    ours = client.create_run(exp, tags={"karman.driver": driver_id()}).info.run_id  # driven by a living process: left alone
    guardian = subprocess.Popen([sys.executable, "-m", "tasks.common.process.lifetime", str(command.pid), "--close-runs"], cwd=ROOT)
    try:
        time.sleep(1.5)  # the guardian has looked at the command's tree
        assert guardian.poll() is None and left.is_running()
        assert client.get_run(theirs).info.status == "RUNNING"
        command.send_signal(signal.SIGKILL)
        command.wait()
        # the guardian gives what the command left 10 s to stop, then closes the run (importing MLflow): bounds with room
        # for a loaded 2-core host
        gone, alive = psutil.wait_procs([left], timeout=60)
        assert not alive and gone == [left]
        assert guardian.wait(timeout=60) == 0
    finally:
        for proc in (left, psutil.Process(guardian.pid) if guardian.poll() is None else None):
            if proc is not None and proc.is_running():
                proc.kill()
    closed = client.get_run(theirs)
    assert closed.info.status == "KILLED"
    named = " ".join(f"{os.path.basename(sys.executable)} -c {script}".split())[:80]  # the command, in one short line
    assert closed.data.tags["karman.error"] == (f"its driver ({socket.gethostname()}:{command.pid}) ended without closing it: "
                                                f"{named} (pid {command.pid}) was killed; its guardian closed the run")
    assert client.get_run(ours).info.status == "RUNNING"


SWALLOWED = """
import os, signal, subprocess, sys, time
from tasks.common.process import lifetime
from tasks.common.config.errors import Interrupted

class Collected:
    def __del__(self):  # the signal lands here, as it can in a transport's __del__ the collector runs
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass

lifetime.raise_on_sigterm()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with lifetime.forwarding_to(child):
    Collected()  # its handler's Interrupted is swallowed ("Exception ignored in ...") and the command would run on
    print("ran on", flush=True)
    child.wait(timeout=20)
print("child", child.returncode, "received", lifetime.received(), flush=True)
try:
    lifetime.raise_pending()
except Interrupted as exc:
    print("raised", exc.signum, flush=True)
"""


def test_a_signal_whose_exception_python_swallowed_still_stops_the_child_and_the_command():
    done = subprocess.run([sys.executable, "-c", SWALLOWED], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ran on", f"child {-signal.SIGTERM} received {int(signal.SIGTERM)}",
                                        f"raised {int(signal.SIGTERM)}"], done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr  # kept, not printed as lost
