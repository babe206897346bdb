"""What the previous version wrote still reads: its deployments validate and plan its cells under their keys, its training runs are reported.

The fixtures in tests/fixtures/previous_version were written by the version before the workloads became peers
(each names its commit and command): the deployments of its prefect.yaml, and a digits training run exported
from its MLflow store (tags, params, metric histories and record.json; the model file left out).
"""

import importlib
import json
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_in_process, strict_json

FIXTURES = ROOT / "tests" / "fixtures" / "previous_version"
DEPLOYMENTS = json.loads((FIXTURES / "deployments.json").read_text())["deployments"]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[f"{d['entrypoint'].rsplit(':', 1)[1]}-{d['name']}" for d in DEPLOYMENTS])
def test_each_deployment_of_the_previous_version_still_validates_and_plans(deployment):
    path, name = deployment["entrypoint"].split(":")
    module = path.removesuffix(".py").replace("/", ".")
    flow = getattr(importlib.import_module(module), name)
    parameters = flow.validate_parameters(deployment["parameters"])  # as Prefect does when a run of the deployment starts
    if name == "benchmark":
        from flows.matrix import plan_benchmark

        from tasks.common.tracking.cells import cell_key

        spec = parameters["spec"]
        plan = plan_benchmark(spec.model_copy(update={"pools": {}}))  # its cells, every one here (no deployments needed)
        keys = {cell_key(f"train/{job.shown['framework']}", job.spec, "digest") for p in plan.workloads for job in p.train}
        # every cell that version trained is a cell of this one, under the same key: a benchmark rerun reuses it (this version
        # adds cells: without `repeats`, each cell runs as many seeds as its workload's run rules ask)
        assert set(deployment["train_cell_keys"]) <= keys


def _recreate(client, experiment_id: str, exported: dict) -> str:
    """A run in this store holding what the previous version logged: its tags, params, metric histories and record."""
    from mlflow.entities import Metric, Param, RunTag

    start = int(time.time() * 1000) - exported["duration_ms"] - 1000
    run = client.create_run(experiment_id, start_time=start, run_name=exported["run_name"], tags=exported["tags"])
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in exported["params"].items()]
    metrics = [Metric(key, value, start + offset, step) for key, history in exported["metrics"].items() for value, step, offset in history]
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i:i + 100])
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i:i + 1000], tags=[RunTag("karman.recreated", "previous version")] if i == 0 else [])
    client.log_dict(run_id, exported["record"], "record.json")
    client.set_terminated(run_id, exported["status"], end_time=start + exported["duration_ms"])
    return run_id


def test_a_training_run_of_the_previous_version_reads_and_is_reported(workdir):
    from mlflow.tracking import MlflowClient

    from tasks.common.records import TrainRecord
    from tasks.common.config.settings import Settings
    from tasks.common.tracking.runs import experiment_id

    exported = json.loads((FIXTURES / "digits_training_run.json").read_text())
    record = TrainRecord.model_validate(exported["record"])  # the record's schema still reads it
    assert (record.config.workload, record.config.framework, record.test["accuracy"]) == ("digits", "torch", pytest.approx(0.937))
    settings = Settings.from_env()
    client = MlflowClient(settings.tracking_uri)
    run_id = _recreate(client, experiment_id(client, settings), exported)

    proc = run_in_process("aggregate", "--runs", "all", "--name", "previous", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = strict_json(proc.stdout.strip().splitlines()[-1])
    assert out["train_rows"] == 1
    report = Path(out["report"]).read_text()
    assert f"`{run_id[:8]}` | digits | torch | cpu x1 | 64 |" in report  # its row in the list of runs
    assert "left out" not in report.lower()
