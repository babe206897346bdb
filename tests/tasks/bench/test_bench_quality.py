"""bench-quality as a user runs it, and the one training loop it shares with train.

bench-quality, as a user runs it: a recipe trained on a real zarr dataset until its rollout target
holds, the test and extra rollouts scored, the solver timed beside it; bad input refused in one line;
no Prefect or MLflow in its process."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_in_process, strict_json
from tests.flows.test_cli import assert_refused
from tests.tasks.train.test_training import dataset_root  # noqa: F401  (the module's dataset fixture)

TINY = ("--dataset", "tiny", "--ngf", "8", "--ndf", "8", "--threads", "1", "--batch-size", "4", "--validate-steps", "3", "--target-steps", "1", "--test-steps", "3")


@pytest.fixture
def data(workdir, dataset_root):  # noqa: F811
    shutil.copytree(dataset_root / "datasets", workdir / "data" / "datasets")
    return workdir


def bench(workdir, *args):
    proc = run_in_process("bench-quality", *TINY, *args, "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return strict_json(proc.stdout.strip().splitlines()[-1])


def test_time_to_target_is_the_first_validation_that_meets_it_and_every_rollout_is_scored(data):
    # A target every model meets (vorticity error <= 1e6 for 2 steps) is met at the first validation.
    out = bench(data, "--epochs", "2", "--validate-every", "1", "--target-vorticity", "1e6", "--target-steps", "2",
                "--extra-dataset", "tiny", "--extra-steps", "4", "--repeats", "2", "--seed", "3")
    assert out["seeds"] == [3, 4] and out["runs_reaching_target"] == 2 and out["recipe"] == "default+ndf=8,ngf=8"
    assert out["time_to_target_min_s"] <= out["time_to_target_median_s"] <= out["time_to_target_max_s"]
    for run in out["runs"]:
        first = run["validations"][0]
        assert (run["epochs"], run["stopped_by"], run["epochs_to_target"]) == (2, "epoch limit", 1)
        assert [v["epoch"] for v in run["validations"]] == [1, 2]
        assert run["time_to_target_s"] == pytest.approx(first["train_s"], abs=0.01) and run["time_to_target_s"] < run["train_s"]
        assert run["samples_to_target"] == run["steps"] // 2 * 4
        assert 0 <= run["test"]["horizon_vorticity"] <= 3 and run["test"]["finite"] == 1.0
        assert run["test"]["strouhal_pred"] is None  # three steps are too short for a Strouhal number: NaN, written as null
        assert sorted(run["extra"]) == sorted(f"tiny/{s}" for s in json.loads((data / "data/datasets/tiny/manifest.json").read_text())["simulations"])
        assert {e["steps"] for e in run["extra"].values()} == {4}
        assert run["surrogate_speedup"] == pytest.approx(run["solver_step_s"] / run["surrogate_step_s"])
        assert run["solver"].startswith("numba on ")


def test_a_missed_target_is_reported_as_such_and_stop_at_target_ends_the_run_there(data):
    missed = bench(data, "--epochs", "2", "--validate-every", "1", "--target-vorticity", "1e-9", "--target-steps", "1")
    assert missed["runs_reaching_target"] == 0 and missed["time_to_target_median_s"] is None
    assert missed["runs"][0]["time_to_target_s"] is None and missed["runs"][0]["epochs"] == 2
    stopped = bench(data, "--epochs", "5", "--validate-every", "2", "--target-vorticity", "1e6", "--target-steps", "1", "--stop-at-target")
    assert (stopped["runs"][0]["epochs"], stopped["runs"][0]["stopped_by"]) == (2, "target reached")


@pytest.mark.parametrize("args, fragment", [
    ((), "give a time budget or an epoch limit"),
    (("--epochs", "1", "--dataset", "nowhere"), "no dataset at"),
    (("--time-budget", "-5"), "--time-budget: Input should be greater than 0 (got '-5')"),
    (("--epochs", "1", "--target-steps", "9"), "target_steps 9 exceeds validate_steps 3"),
    (("--epochs", "1", "--batch-size", "500"), "batch size 500 exceeds the"),
])
def test_bad_input_is_refused_with_one_line(data, args, fragment):
    assert_refused(run_in_process("bench-quality", *TINY, *args, cwd=data), fragment)


def test_a_run_of_bench_quality_loads_neither_prefect_nor_mlflow(data):
    code = ("import runpy, sys\n"
            f"sys.argv = ['flows', 'bench-quality', *{list(TINY)!r}, '--epochs', '1', '--test-steps', '2']\n"
            "try:\n    runpy.run_module('flows', run_name='__main__')\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print(sorted(m for m in ('prefect', 'mlflow', 'tensorflow', 'torch_xla') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=data, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.full  # trains twice
def test_bench_quality_trains_as_train_does_the_same_seed_gives_the_same_losses(data):
    """One loop: the same spec through `train` (a child process, MLflow) and through bench-quality (in
    process, nothing recorded) takes the same steps and ends with the same losses."""
    from mlflow.tracking import MlflowClient

    from tasks.common.records import RECORD_FILE, TrainRecord

    common = ("--dataset", "tiny", "--ngf", "8", "--ndf", "8", "--threads", "1", "--epochs", "2", "--seed", "5", "--validate-steps", "3",
              "--target-steps", "1")
    trained = run_in_process("train", *common, "--batch-sizes", "4", "--validate-every", "0", "--json", cwd=data)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_id = json.loads(trained.stdout.strip().splitlines()[-1])["run_id"]
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    record = TrainRecord.model_validate_json((data / client.download_artifacts(run_id, RECORD_FILE, str(data))).read_text())
    benched = bench(data, "--epochs", "2", "--seed", "5", "--validate-every", "2")["runs"][0]
    assert benched["steps"] == record.summary.steps and benched["epochs"] == record.summary.epochs == 2
    assert set(benched["final_losses"]) == set(record.summary.final_losses) >= {"loss_l1"}
    for name, value in record.summary.final_losses.items():
        assert benched["final_losses"][name] == pytest.approx(value, rel=1e-6, abs=1e-9), name
