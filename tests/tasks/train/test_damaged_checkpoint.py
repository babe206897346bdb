"""A run whose newest checkpoint is damaged resumes from the one before, says which epochs it trains again, and logs each epoch once."""

import json
import os
import signal

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import run_in_process
from tests.tasks.train.interrupt import stop_after_epoch
from tests.workloads.toy.workload import generate

pytestmark = pytest.mark.full  # trains through the CLI
TOY = {"KARMAN_WORKLOADS": "toy=tests.workloads.toy"}  # the toy workload's table entry: a few milliseconds a step
EPOCHS = 8


def test_a_damaged_newest_checkpoint_resumes_from_the_one_before_and_logs_every_epoch_once(workdir):
    generate(workdir / "data" / "datasets" / "blobs", samples=240, seed=1)
    args = ("--workload", "toy", "--dataset", "blobs", "--threads", "1", "--batch-sizes", "2", "--epochs", str(EPOCHS), "--validate-every", "1")
    run_id = stop_after_epoch(workdir, args, 3, signal.SIGTERM, env=TOY)
    run_dir = workdir / "data" / "runs" / run_id
    newest = json.loads((run_dir / "checkpoint.digests.json").read_text())["checkpoints"][0]["epoch"]
    assert newest >= 3 and (run_dir / "checkpoint.previous.pt").is_file()
    checkpoint = run_dir / "checkpoint.pt"
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    checkpoint.write_bytes(bytes(data))

    proc = run_in_process("train", "--workload", "toy", "--resume", run_id, "--json", cwd=workdir, env=TOY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = {line.split(" - ", 1)[-1] for line in proc.stderr.splitlines() if "is damaged or missing" in line}  # one line (each handler shows it)
    assert len(warned) == 1 and warned.pop().endswith(f"{checkpoint} (epoch {newest}) is damaged or missing; resuming from the one before, "
                                                   f"checkpoint.previous.pt (epoch {newest - 1}): epoch {newest} will be trained again"), warned
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["run_id"] == run_id and out["epochs"] == EPOCHS
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    assert client.get_run(run_id).info.status == "FINISHED"
    for metric in ("epoch_time_s", "val_accuracy"):  # the epoch trained again is logged once, by the run before
        assert sorted(m.step for m in client.get_metric_history(run_id, metric)) == list(range(1, EPOCHS + 1)), metric
