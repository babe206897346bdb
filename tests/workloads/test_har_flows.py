"""The har workload through the CLI: generate --source synthetic writes the synthetic windows, their subject split and a manifest (stable digest, a no-op again), a short torch run over two hosts of a (simulated) SLURM job trains a small BiLSTM and scores the held-out subjects, tensorflow over the same two hosts and JAX in one process take the same steps, and bad sizes are refused in one line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zarr
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, run_in_process, shared_prefect_api
from tests.flows.test_cli import assert_refused
from tests.tasks.train.interrupt import resumes_to_its_end


def _generate(workdir, *args) -> dict:
    proc = run_in_process("generate", "--workload", "har", "--dataset", "har", *args, "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def generated(module_workdir) -> tuple:
    return module_workdir, _generate(module_workdir, "--source", "synthetic")  # the steps below are the synthetic data's


def test_generate_writes_synthetic_windows_split_by_subject_and_a_manifest_once(generated):
    workdir, first = generated
    folder = workdir / "data" / "datasets" / "har"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert first["written"] and manifest["digest"] == first["digest"] and manifest["count"] == first["windows"] == 2880
    assert manifest["synthetic"] is True and manifest["source"] == manifest["data"] == "synthetic" and "gravity" in manifest["sensor_model"]
    root = zarr.open_group(folder / "store.zarr", mode="r")
    windows, activities, subjects = (np.asarray(root[k]) for k in ("windows", "activities", "subjects"))
    assert windows.shape == (2880, 128, 9) and windows.dtype == np.float32
    assert np.bincount(activities).tolist() == manifest["per_activity"] == [480] * 6
    roles = {role: set(np.asarray(root[f"subjects_{role}"]).tolist()) for role in ("train", "val", "test")}
    assert {r: len(s) for r, s in roles.items()} == {"train": 21, "val": 4, "test": 5} and set.union(*roles.values()) == set(range(1, 31))
    assert manifest["split"] == {r: int(np.isin(subjects, list(s)).sum()) for r, s in roles.items()} == {"train": 2016, "val": 384, "test": 480}

    again = _generate(workdir, "--source", "synthetic")  # complete: nothing written, the same digest
    assert (again["written"], again["digest"]) == (False, first["digest"])
    run = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).get_run(again["run_id"])
    assert run.data.tags["karman.dataset_digest"] == first["digest"] and run.data.params["synthetic"] == "True"
    assert run.data.params["data"] == "synthetic" and "SYNTHETIC" in run.data.tags["mlflow.note.content"]


def on_two_hosts(workdir, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """infra/slurm-train.sbatch as sbatch runs it in a job of two nodes, which are this machine under two names
    (localhost and 127.0.0.1); srun is stood in by tests/infra/fake_srun.py, which starts the step's tasks here
    with SLURM's environment (and ``env``)."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'infra' / 'fake_srun.py'} \"$@\"\n")
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_JOB_NODELIST": "localhost,127.0.0.1", "SLURM_SUBMIT_DIR": str(workdir), "KARMAN_BENCH_ROOT": str(ROOT),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": os.environ.get("PREFECT_API_URL") or shared_prefect_api(), **(env or {})}
    return subprocess.run(["bash", str(ROOT / "infra" / "slurm-train.sbatch"), *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=900)


SMALL_RUN = ("--workload", "har", "--dataset", "har", "--batch-sizes", "64", "--layers", "1", "--units", "8", "--max-steps", "6", "--threads", "1", "--json")


@pytest.fixture(scope="module")
def torch_on_two_hosts(generated) -> dict:
    temporary = generated[0] / "temporary-torch"  # the temporary folder (TMPDIR) of the job's processes on both hosts
    temporary.mkdir()
    proc = on_two_hosts(generated[0], "--framework", "torch", *SMALL_RUN, env={"TMPDIR": str(temporary)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(temporary.iterdir()) == []  # each host's torchrun kept its log folders in the job's folder, gone with it
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_short_torch_run_over_two_hosts_trains_and_scores_the_held_out_subjects(generated, torch_on_two_hosts):
    workdir, first = generated
    out = torch_on_two_hosts
    run = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).get_run(out["run_id"])
    metrics, params = run.data.metrics, run.data.params
    assert run.info.status == "FINISHED" and out["steps"] == 6 and params["workload"] == "har"
    assert (out["world_size"], out["strategy"]) == (2, "ddp") and "x2 (DDP over gloo)" in out["device"] and params["hosts"] == "2"
    assert (params["layers"], params["units"], params["network_layers"], params["network_units"]) == ("1", "8", "1", "8")
    assert params["parameters"] == str(2 * (4 * 8 * (9 + 8) + 32) + 16 * 6 + 6) and params["synthetic_data"] == "True"
    assert params["data"] == "synthetic"  # the data's source, as reports and MLflow show it
    for name in ("accuracy", "precision", "recall", "f1"):
        assert 0.0 <= metrics[f"test_{name}"] <= 1.0 and f"val_{name}" in metrics
    assert metrics["test_loss"] > 0 and run.data.tags["karman.dataset_digest"] == first["digest"]
    assert float(params["flops_per_sample"]) == pytest.approx(2 * 128 * 4 * 8 * (9 + 8) * 2 * 2 + 2 * 2 * 128 * 4 * 8 * 8 + 3 * 2 * 16 * 6)


def test_tensorflow_over_the_same_two_hosts_takes_the_same_steps(generated, torch_on_two_hosts):
    """Each worker trains on its half of every batch: the mean of the two halves' gradients is the whole batch's,
    so the run's loss is torch's over two hosts (and one process's) to float precision."""
    proc = on_two_hosts(generated[0], "--framework", "tensorflow", *SMALL_RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["world_size"], out["strategy"], out["steps"]) == (2, "multiworker", 6) and "2 workers" in out["device"]
    assert out["final_ce"] == pytest.approx(torch_on_two_hosts["final_ce"], rel=1e-5)
    assert out["test_f1"] == pytest.approx(torch_on_two_hosts["test_f1"], abs=0.01)


def test_jax_over_two_devices_of_one_process_takes_the_same_steps_as_torch_over_two_hosts(generated, torch_on_two_hosts):
    """The JAX BiLSTM (a scan over time per direction), each batch split over two CPU devices of one process and
    the weights replicated (jit's partitioner sums the halves' gradients): the same six steps as torch's two halves."""
    proc = run_in_process("train", "--framework", "jax", "--world-size", "2", *SMALL_RUN, cwd=generated[0])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["world_size"], out["strategy"], out["steps"]) == (2, "spmd", 6) and "x2" in out["device"]
    assert out["final_ce"] == pytest.approx(torch_on_two_hosts["final_ce"], rel=1e-5)
    assert out["test_f1"] == pytest.approx(torch_on_two_hosts["test_f1"], abs=0.01)
    run = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).get_run(out["run_id"])
    assert run.data.params["framework"] == "jax" and run.data.params["parameters"] == str(2 * (4 * 8 * (9 + 8) + 32) + 16 * 6 + 6)


def test_a_network_without_layers_or_a_batch_that_does_not_split_over_the_workers_is_refused_in_one_line_and_nothing_is_written(generated):
    workdir, _ = generated
    runs = sorted((workdir / "data").rglob("*"))
    proc = run_in_process("train", "--workload", "har", "--dataset", "har", "--layers", "0", cwd=workdir)
    assert_refused(proc, "--layers", "greater than 0")
    assert sorted((workdir / "data").rglob("*")) == runs
    proc = run_in_process("train", "--workload", "har", "--dataset", "har", "--framework", "tensorflow", "--strategy", "multiworker", "--world-size", "2",
                          "--batch-sizes", "63", cwd=workdir)
    assert_refused(proc, "batch size 63 does not split evenly over 2 devices; use a multiple of 2")
    assert sorted((workdir / "data").rglob("*")) == runs


# Each framework's trainer restores its state exactly from a checkpoint file (the step tests beside this module); the
# loop's resume, the same for every workload, is compared with an uninterrupted run in tests/tasks/train/.
@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_a_run_stopped_by_sigterm_after_a_validated_epoch_resumes_to_its_end(generated, framework):
    resumes_to_its_end(generated[0], ("--workload", "har", "--dataset", "har", "--framework", framework, "--batch-sizes", "504",
                       "--layers", "1", "--units", "8", "--threads", "1"), epochs=5)
