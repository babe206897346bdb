"""Faults an operator meets: signals, kills, concurrent writers and a tracking server that is down.

Faults an operator meets, with real processes and signals: a command stopped by SIGTERM or Ctrl-C,
one killed outright, two writers of one run or one dataset, a tracking server that is down. Each ends
with one verdict line, the run's status saying what happened, nothing left running, and a clean resume."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, kill_tree, run_cli, run_in_process, shared_prefect_api
from tests.tasks.train.test_training import dataset_root  # noqa: F401  (the module's dataset fixture)

pytestmark = pytest.mark.full
# Many short epochs: a run that is still training when the test acts on it.
LONG = ("--dataset", "tiny", "--ngf", "8", "--ndf", "8", "--threads", "1", "--batch-sizes", "2", "--epochs", "3000",
        "--validate-every", "0")


@pytest.fixture
def trainable(workdir, dataset_root):  # noqa: F811
    shutil.copytree(dataset_root / "datasets", workdir / "data" / "datasets")
    return workdir


_started: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_leftovers():
    """A failed test must not leave its commands training: their trees are killed at its end."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            kill_tree(proc.pid)


def start(*args: str, cwd, own_server: bool = False) -> subprocess.Popen:
    """The command, as a process; ``own_server``: with a temporary Prefect server of its own, as for a user
    who has none (else reporting to the tests' server)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "KARMAN_STOP_GRACE_S": "20",
           "PREFECT_API_URL": shared_prefect_api()}
    if own_server:
        del env["PREFECT_API_URL"]
    _started.append(subprocess.Popen([sys.executable, "-m", "flows", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
    return _started[-1]


def wait_for_line(proc: subprocess.Popen, fragment: str, timeout: float = 180) -> list[str]:
    """stderr lines up to the first holding ``fragment``."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"the command ended before {fragment!r}:\n" + "".join(lines[-30:]))
        lines.append(line)
        if fragment in line:
            return lines
    raise AssertionError(f"no {fragment!r} within {timeout} s:\n" + "".join(lines[-30:]))


def tree(proc: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children(recursive=True)


def assert_all_gone(procs: list[psutil.Process], timeout: float = 30) -> None:
    gone, alive = psutil.wait_procs(procs, timeout=timeout)
    assert not alive, [" ".join(p.cmdline()[:6]) for p in alive]


def the_run(status: str | None = None):
    runs = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).search_runs(
        ["1"], "tags.`karman.stage` = 'train'", order_by=["attributes.start_time DESC"])
    return runs[0]


def test_sigterm_stops_training_at_a_step_marks_the_run_killed_and_it_resumes(trainable):
    proc = start("train", *LONG, cwd=trainable)
    wait_for_line(proc, "] epoch 3:")  # checkpoints exist
    below = tree(proc)
    assert any("job_main" in " ".join(p.cmdline()) for p in below)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and time.monotonic() - t0 < 60  # at the step it was in (the verdict), with room for a loaded host
    verdict = err.strip().splitlines()[-1]
    run = the_run()
    assert verdict.startswith("python -m flows train: stopped by SIGTERM at epoch "), verdict
    assert f"resume with python -m flows train --resume {run.info.run_id}" in verdict
    assert "Traceback" not in err
    assert run.info.status == "KILLED" and "stopped by SIGTERM" in run.data.tags["karman.error"]
    assert_all_gone(below)
    # Ctrl-C on the resumed run: the same, with SIGINT
    again = start("train", "--resume", run.info.run_id, cwd=trainable)
    wait_for_line(again, "resuming")
    wait_for_line(again, "] epoch ")
    again.send_signal(signal.SIGINT)
    _, err = again.communicate(timeout=60)
    assert again.returncode == 128 + signal.SIGINT, err[-2000:]
    assert "stopped by SIGINT at epoch" in err.strip().splitlines()[-1]
    assert the_run().info.status == "KILLED"


def test_sigterm_stops_a_two_process_tensorflow_run_at_the_same_step_in_both_workers(trainable):
    """The command passes the signal to both workers (forked from its warm server as a group); they agree on the step
    to stop at through the step's own reduction, so neither waits forever in a collective the other left."""
    proc = start("train", *LONG, "--framework", "tensorflow", "--strategy", "multiworker", "--world-size", "2", cwd=trainable)
    wait_for_line(proc, "] epoch 2:")
    below = tree(proc)
    servers = {p.pid for p in below if "multiprocessing.forkserver" in " ".join(p.cmdline())}
    assert len([p for p in below if p.ppid() in servers]) == 2  # the two workers, forked from the server (tasks.common.process.warm)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM at epoch " in err.strip().splitlines()[-1] and "Traceback" not in err
    run = the_run()
    assert run.info.status == "KILLED" and run.data.params["strategy"] == "multiworker"
    assert_all_gone(below)


def test_a_command_killed_outright_leaves_nothing_running_and_its_run_is_closed_then_resumed(trainable):
    proc = start("train", *LONG, cwd=trainable, own_server=True)
    wait_for_line(proc, "] epoch 2:")
    below = tree(proc)
    names = " ".join(" ".join(p.cmdline()) for p in below)
    assert "job_main" in names and "uvicorn" in names  # the training child and the temporary Prefect server
    run_id = the_run().info.run_id
    proc.kill()
    t0 = time.monotonic()
    proc.wait()
    # its guardian, and no other command (none starts before this is checked): the run is KILLED, saying why; the
    # guardian first gives what the command left 10 s to stop, and on a loaded 2-core host (the suite's) took over 15 s
    while the_run().info.status == "RUNNING" and time.monotonic() - t0 < 90:
        time.sleep(0.5)
    run = the_run()
    assert run.info.run_id == run_id and run.info.status == "KILLED", run.info.status
    assert run.data.tags["karman.error"] == (f"its driver ({socket.gethostname()}:{proc.pid}) ended without closing it: "
                                             f"{os.path.basename(sys.executable)} -m flows train (pid {proc.pid}) was killed; "
                                             "its guardian closed the run")
    assert_all_gone(below)  # the child died with its parent; the guardian stopped the server
    import glob
    import tempfile

    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"karman-job-{proc.pid}-*"))  # and removed the job's folder
    # it resumes; a second writer of the run is refused while the first trains
    first = start("train", "--resume", run_id, cwd=trainable)
    lines = wait_for_line(first, "resuming")
    assert not any("was left RUNNING" in line for line in lines), "".join(lines)  # nothing left for the next command to reap
    wait_for_line(first, "] epoch ")
    second = run_in_process("train", "--resume", run_id, cwd=trainable)
    assert second.returncode == 2
    assert f"run {run_id} is being written by pid {first.pid} on host {socket.gethostname()}" in second.stderr.strip().splitlines()[-1]
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGTERM and the_run().info.status == "KILLED"


def test_a_second_sweep_of_a_dataset_being_written_is_refused(workdir):
    args = ["generate", "--dataset", "busy", "--reynolds", "8,10,12,14", "--nx", "48", "--ny", "24", "--size", "5",
            "--warmup-steps", "3000000", "--frames", "4", "--frame-every", "50", "--workers", "1"]  # a minute a simulation
    first = start(*args, cwd=workdir)
    wait_for_line(first, "to run")
    second = run_cli(*args, cwd=workdir)
    assert second.returncode == 2
    assert f"dataset 'busy' is being written by pid {first.pid} on host" in second.stderr.strip().splitlines()[-1]
    below = tree(first)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1] == "python -m flows generate: stopped by SIGTERM"
    assert_all_gone(below)  # the Dask cluster and the temporary Prefect server with it


def test_a_tracking_server_that_is_down_ends_the_command_in_seconds(workdir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    shared_prefect_api()  # up before the clock starts (run without xdist, this process starts it on first use)
    t0 = time.monotonic()
    proc = run_cli("train", "--dataset", "tiny", cwd=workdir, env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"})
    assert proc.returncode == 2 and time.monotonic() - t0 < 45  # not MLflow's retries with backoff (minutes); a loaded host's imports take some
    assert proc.stderr.strip().splitlines() == [
        f"python -m flows train: error: the MLflow tracking server http://127.0.0.1:{port} does not answer ([Errno 111] Connection refused); "
        "start it (infra/start-mlflow-server.sh) or set MLFLOW_TRACKING_URI to one that runs"]
    assert not (workdir / "data").exists() or not any((workdir / "data").iterdir())


def test_a_damaged_model_is_refused_and_a_child_that_crashes_ends_in_one_verdict_line(trainable):
    proc = run_in_process("train", "--dataset", "tiny", "--ngf", "8", "--ndf", "8", "--threads", "1", "--batch-sizes", "2", "--epochs", "1",
                   "--max-steps", "1", "--validate-every", "0", "--json", cwd=trainable)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_id = json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    (model,) = (trainable / "mlartifacts").rglob(f"{run_id}/artifacts/model/generator.pt")
    whole = model.read_bytes()
    infer = ("infer", "--model-run", run_id, "--steps", "2")
    # truncated: refused before any work, from the size recorded when it was written
    model.write_bytes(whole[:100])
    proc = run_in_process(*infer, cwd=trainable)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"python -m flows infer: error: the model artifact model/generator.pt of training run {run_id} has 100 bytes, not the "
        f"{len(whole)} it was written with: it is truncated or damaged; train again or roll out another run"]
    # a flipped byte: the rollout child refuses it by its checksum, before loading it
    model.write_bytes(whole[:-10] + bytes(b ^ 0xFF for b in whole[-10:]))
    proc = run_in_process(*infer, cwd=trainable)
    assert proc.returncode == 2
    assert "is damaged (its SHA-256 differs from the one recorded when it was written)" in proc.stderr.strip().splitlines()[-1]
    # a run logged without those records (an older one) and a truncated file: the child crashes on it,
    # and the command ends with the cause in one line; the traceback is in the log once
    meta_path = model.with_name("meta.json")
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({k: v for k, v in meta.items() if not k.startswith("generator_")}))
    model.write_bytes(whole[:100])
    proc = run_cli(*infer, cwd=trainable)  # the command's own stderr, the child's traceback relayed into it
    assert proc.returncode == 1
    verdict = proc.stderr.strip().splitlines()[-1]
    assert verdict.startswith("python -m flows infer: failed: rollout child crashed: "), verdict
    assert proc.stderr.count("Traceback") == 1


def test_two_commands_on_a_new_local_tracking_store_both_succeed(workdir):
    """The first use of a SQLite store creates its tables and the experiment; two commands starting
    together take turns and both log their runs."""
    (workdir / "mlflow.db").unlink()  # no tables yet (the folders of the other tests start from a copy of a new store's)
    # (the digits' dataset: a generate command with no Dask cluster and no simulation, so that both reach the store together)
    procs = [start("generate", "--workload", "digits", "--dataset", f"d{i}", cwd=workdir) for i in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    runs = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).search_runs(["1"])
    assert sorted(r.data.tags["karman.dataset"] for r in runs) == ["d0", "d1"]
