"""A workload joins with its own folder and one table entry.

A workload joins with its own folder and one table entry: the toy workload (tests/workloads/toy) trains
through the CLI, is evaluated against its target, is logged with its record and
appears in the report; nothing outside its folder names it."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tasks.common.records import RECORD_FILE, TrainRecord
from tests.conftest import ROOT, run_in_process
from tests.flows.test_cli import assert_refused
from tests.workloads.toy.workload import generate

TOY = {"KARMAN_WORKLOADS": "toy=tests.workloads.toy"}  # the table entry, for this test's commands


@pytest.fixture
def toy(workdir):
    generate(workdir / "data" / "datasets" / "blobs", samples=240, seed=1)
    return workdir


def _train(workdir, *args) -> dict:
    proc = run_in_process("train", "--workload", "toy", "--dataset", "blobs", "--threads", "1", *args, "--json", cwd=workdir, env=TOY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.full  # trains through the CLI
def test_a_workload_from_its_own_folder_trains_is_evaluated_logged_and_reported(toy, own_ceilings):
    out = _train(toy, "--epochs", "6", "--batch-sizes", "16", "--validate-every", "2", "--stop-at-target")
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(out["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["karman.workload"] == "toy"
    record = TrainRecord.model_validate_json(Path(client.download_artifacts(out["run_id"], RECORD_FILE, str(toy))).read_text())
    assert record.config.workload == "toy" and record.config.train_samples == 144 and record.config.workload_params["hidden_units"] == 16
    summary = record.summary
    assert summary.validation["accuracy"] >= 0.9 and summary.target_reached and summary.ended_by == "target reached"
    assert summary.epochs == summary.epochs_to_target and summary.epochs % 2 == 0 and summary.steps == summary.epochs * (144 // 16)
    assert run.data.metrics["final_ce"] == pytest.approx(summary.final_losses["loss_ce"])
    assert [m.step for m in client.get_metric_history(out["run_id"], "val_accuracy")] == list(range(2, summary.epochs + 1, 2))
    assert "model/mlp.pt" in {a.path for a in client.list_artifacts(out["run_id"], "model")}
    # MFU: the trainer's FLOPs at the run's speed, against a ceiling measured in the run (none cached yet) and the derived peak
    u = record.utilisation
    assert u.flops_per_sample == 320 and u.achieved_tflops == pytest.approx(320 * summary.samples_per_s / 1e12)
    assert u.dtype == "fp32" and u.ceiling_source.startswith("quick ceiling of a training run") and "of the host's" in u.peak_source
    assert 0 < u.of_ceiling < 1 and 0 < u.of_peak < u.of_ceiling * 3
    assert run.data.metrics["mfu_ceiling"] == pytest.approx(u.of_ceiling) and run.data.metrics["mfu_peak"] == pytest.approx(u.of_peak)
    cached = json.loads((toy / "data" / "ceilings.json").read_text())["ceilings"]
    assert [c["framework"] for c in cached.values()] == ["torch"]  # the next run of this host reads it

    report = run_in_process("aggregate", "--runs", "all", "--name", "toy", "--json", cwd=toy, env=TOY)
    assert report.returncode == 0, report.stderr[-3000:]
    text = Path(json.loads(report.stdout.strip().splitlines()[-1])["report"]).read_text()
    row = next(line for line in text.splitlines() if f"`{out['run_id'][:8]}`" in line and "| toy |" in line)
    assert "FINISHED" in row
    assert "toy, torch, fp32, MLP 2-16-2, budget 6 epochs, 1 CPU thread" in text


@pytest.mark.full  # trains through the CLI
def test_the_same_workload_trains_in_its_second_framework(toy):
    out = _train(toy, "--framework", "tensorflow", "--epochs", "4", "--batch-sizes", "16", "--validate-every", "4")
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    record = TrainRecord.model_validate_json(Path(client.download_artifacts(out["run_id"], RECORD_FILE, str(toy))).read_text())
    assert (record.config.workload, record.config.framework, record.config.strategy) == ("toy", "tensorflow", "default")
    assert record.summary.steps == 4 * (144 // 16) and record.summary.validation["accuracy"] >= 0.9
    assert "model/mlp.keras" in {a.path for a in client.list_artifacts(out["run_id"], "model")}


@pytest.mark.full  # trains through the CLI
def test_the_table_knows_a_workload_only_where_it_is_named(toy):
    assert_refused(run_in_process("train", "--workload", "toy", "--dataset", "blobs", cwd=toy), "unknown workload 'toy'; choose one of calo, digits, har, karman")
    assert_refused(run_in_process("train", "--workload", "toy", "--dataset", "blobs", "--framework", "jax", cwd=toy, env=TOY),
                   "workload toy has no jax version; it runs in torch, tensorflow")
    names = subprocess.run(["git", "grep", "-l", "-i", "toy", "--", "flows", "tasks", "models", "infra"], cwd=ROOT, capture_output=True, text=True)
    assert names.stdout == ""  # nothing outside the workload's own folder knows it


def test_a_framework_a_workload_lacks_is_refused_by_name(monkeypatch):
    from tasks.common.config.errors import UserError
    from tasks.workloads import check_framework, get_workload

    with pytest.raises(UserError, match="^unknown workload 'toy'; choose one of calo, digits, har, karman$"):
        get_workload("toy")
    for name, value in TOY.items():  # every built-in workload has every framework: the toy one has two
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match="^workload toy has no jax version; it runs in torch, tensorflow$"):
        check_framework(get_workload("toy"), "jax")


@pytest.mark.full  # trains through the CLI
def test_its_own_option_shows_in_its_help_is_logged_and_swept_by_a_benchmark(toy):
    shown = run_in_process("train", "--workload", "toy", "--help", cwd=toy, env=TOY)
    assert shown.returncode == 0 and "--hidden" in shown.stdout and not {"--recipe", "--layers"} & set(shown.stdout.split())
    assert_refused(run_in_process("train", "--workload", "har", "--hidden", "8", cwd=toy, env=TOY), "workload har takes no --hidden (toy's option)")
    out = _train(toy, "--epochs", "1", "--batch-sizes", "16", "--hidden", "8")
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(out["run_id"])
    assert (run.data.params["hidden"], run.data.params["hidden_units"]) == ("8", "8") and run.info.run_name == "toy-torch-cpu-b16-h8"
    assert run.data.params["parameters"] == str(2 * 8 + 8 + 8 * 2 + 2)

    (toy / "bench.json").write_text(json.dumps({"workloads": ["toy"], "train": {"epochs": 1},
                                                "repeats": 1, "sweep": {"hidden": [4, 8]}, "aggregate": {"name": "toy-sweep"}}))
    proc = run_in_process("benchmark", "--spec", "bench.json", "--sweep", "hidden=4:8", "--batch-sizes", "16", "--json", cwd=toy, env=TOY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    swept = client.search_runs([run.info.experiment_id], "params.workload = 'toy' and tags.`karman.cell` != ''")
    assert sorted(r.data.params["hidden"] for r in swept) == ["4", "8"]  # one cell per value of its own option
    assert_refused(run_in_process("benchmark", "--workloads", "digits", "--sweep", "hidden=4:8", cwd=toy, env=TOY),
                   "--sweep hidden=4:8: toy's option; no workload of this benchmark (digits) takes it")
