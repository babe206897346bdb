"""A benchmark stopped by SIGTERM or Ctrl-C stops at its running cell's step, starts no other cell, reports what finished and resumes on its next run."""

import json
import os
import signal

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import run_in_process
from tests.tasks.train.interrupt import _ended_epoch
from tests.workloads.toy.workload import generate

pytestmark = pytest.mark.full  # trains through the CLI
TOY = {"KARMAN_WORKLOADS": "toy=tests.workloads.toy"}  # the toy workload's table entry: a few milliseconds an epoch
EPOCHS = 30  # per cell: enough that a cell is still training when the signal lands
BENCH = ("benchmark", "--spec", "bench.json", "--json")


def _train_runs(client: MlflowClient) -> list:
    experiment = client.get_experiment_by_name("test").experiment_id
    return client.search_runs([experiment], "tags.`karman.stage` = 'train'")


def test_a_signal_stops_the_benchmark_at_its_running_cell_which_the_next_run_resumes(workdir):
    generate(workdir / "data" / "datasets" / "blobs", samples=240, seed=1)
    (workdir / "bench.json").write_text(json.dumps({"workloads": ["toy"], "batch_sizes": [16, 32], "repeats": 1,
                                                    "train": {"epochs": EPOCHS, "threads": 1}, "aggregate": {"name": "stopped"}}))
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])

    # SIGTERM once the first cell's first epoch is checkpointed: that cell stops, the second never starts
    proc = run_in_process(*BENCH, cwd=workdir, env=TOY, sigterm_when=lambda text: _ended_epoch(text) >= 1)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    (stopped,) = _train_runs(client)
    assert stopped.info.status == "KILLED" and stopped.data.params["batch_size"] == "16", stopped.data.tags.get("karman.error")
    assert (workdir / "data" / "runs" / stopped.info.run_id / "checkpoint.pt").is_file()
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m flows benchmark: stopped by SIGTERM") and "run the benchmark again to resume" in last, last
    report = (workdir / "data" / "reports" / "stopped" / "report.md").read_text()
    assert "stopped by SIGTERM" in report

    # Ctrl-C while the resumed cell trains: the same run stops again, its checkpoint a later one
    proc = run_in_process(*BENCH, cwd=workdir, env=TOY, signum=signal.SIGINT,
                          sigterm_when=lambda text: "resuming after epoch" in text and _ended_epoch(text) >= 2)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr[-3000:]
    (again,) = _train_runs(client)
    assert again.info.run_id == stopped.info.run_id and again.info.status == "KILLED"
    assert "stopped by SIGINT" in proc.stderr.strip().splitlines()[-1]

    # the next run resumes the stopped cell to its end, then runs the second
    proc = run_in_process(*BENCH, cwd=workdir, env=TOY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = json.loads(proc.stdout.strip().splitlines()[-1])["cells"]
    assert [(c["status"], c["batch_size"]) for c in cells] == [("FINISHED", 16), ("FINISHED", 32)]
    assert cells[0]["run_id"] == stopped.info.run_id
    runs = {r.info.run_id: r for r in _train_runs(client)}
    assert len(runs) == 2 and {r.info.status for r in runs.values()} == {"FINISHED"}
    assert runs[stopped.info.run_id].data.metrics["epochs"] == EPOCHS
    history = client.get_metric_history(stopped.info.run_id, "epoch_time_s")
    assert sorted(m.step for m in history) == list(range(1, EPOCHS + 1))  # each epoch logged once across the three parts
