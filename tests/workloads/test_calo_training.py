"""The calo GAN's training: torch, Keras and JAX take the same four-tape step from the same weights and batch, a checkpoint restores both networks and optimisers, a short run through the CLI over two DDP processes trains, scores the test split and keeps the generator and a figure, tensorflow trains over two MultiWorkerMirrored workers, jax through the CLI is logged and scores the test split; bad batches are refused in one line."""

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import run_in_process
from tests.flows.test_cli import assert_refused
from models.calo.nets import parameter_counts
from tasks.workloads.calo.workload import CPU
from tests.tasks.train.interrupt import resumes_to_its_end
from tests.workloads.digits_step import stepped_when_asked


@pytest.fixture(scope="module")
def stepped() -> Callable[[str], dict]:
    """A framework's two steps (tests/workloads/calo_step.py) in a job process of its own, taken when a test first asks for
    them and kept for the module: each test waits for at most two frameworks' children (torch's and Keras's, or JAX's),
    not all three before its first (3 min 33 s in one setup on a slow host, of the test's 10 min). JAX compiles with LLVM's
    optimisations: without them its 3-D convolutions run slower than the compiler saves."""
    return stepped_when_asked("tests.workloads.calo_step", fast_compile=False)


@pytest.mark.parametrize("other", ["tensorflow", "jax"])
def test_keras_and_jax_take_torchs_four_tape_step(stepped, other):
    torch_, other_ = stepped("torch"), stepped(other)
    assert set(torch_["first"]) == {"loss_d_real", "loss_d_fake", "loss_g_first", "loss_g_second", "loss_g"}
    # JAX's generator forward differs more from torch's on some hosts (1.5e-6 against Keras's 3e-7 for loss_g_first on an
    # AVX2 host); G's first RMSprop update, nearly sign-like where a gradient is tiny, amplifies that: after it, JAX's
    # figures on that host were 1.9e-5 (loss_g_second), 3.8e-3 (the statistics) and 6.9e-3 (step 2); Keras's 1.5e-5 at most
    after_g = {"tensorflow": (1e-5, 1e-3, 1e-2), "jax": (1e-4, 1e-2, 2e-2)}[other]
    for name, value in torch_["first"].items():  # the four tapes of step 1, the updates between them included
        rel = after_g[0] if name in ("loss_g_second", "loss_g") else 1e-5
        assert other_["first"][name] == pytest.approx(value, rel=rel), name
    # the average's batch-norm statistics after step 1, recomputed over the calibration batches: the same in both
    assert set(torch_["statistics"]) == set(other_["statistics"]) and len(torch_["statistics"]) == 10
    for name, value in torch_["statistics"].items():
        assert other_["statistics"][name] == pytest.approx(value, rel=after_g[1], abs=1e-6), name  # float32 weights a step apart
    # step 2 starts from weights that RMSprop's first, nearly sign-like update moved: float32 rounding grows to about 1e-3
    for name, value in torch_["second"].items():
        assert other_["second"][name] == pytest.approx(value, rel=after_g[2]), name
    if other == "jax":  # its convolutions folded into 2-D ones on a CPU: XLA's 3-D convolutions' sums (tasks/workloads/calo/jax.py)
        assert other_["folded"] < 1e-5
    assert torch_["second"]["loss_g"] < torch_["first"]["loss_g"]  # the generator learns (its energy sum first)
    for r in (torch_, other_):
        assert r["rates"] == pytest.approx([1e-3 * (0.01 + 0.99 * 0.5)] * 3, rel=1e-6)  # halfway along the cosine: both optimisers
        assert r["restored"] and r["second"] == r["second_fresh"]  # a checkpoint carries both networks, the average and both optimisers
        assert r["averaged"] and r["recalibrated"]  # the generator's moving average after one step (nets.average_decay); its own statistics
        assert r["flags"] == pytest.approx([0.0, 0.0, 1.5]) and r["generated_sum"] > 0
        assert set(r["scores"]) == {"longitudinal_err", "sampling_fraction_err", "x_err", "y_err", "resolution_err"}
    shares = dict(torch_["shares"])
    assert shares.pop("step_s") > 0 and set(shares) == {"input", "forward", "backward", "optimizer", "other"}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6) and shares["forward"] > 0.1 and shares["backward"] > 0.1


@pytest.fixture(scope="module")
def showers(module_workdir):
    proc = run_in_process("generate", "--workload", "calo", "--dataset", "showers", "--events", "100", "--workers", "1", "--json", cwd=module_workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return module_workdir


def test_a_short_run_over_two_ddp_processes_trains_scores_the_test_split_and_keeps_the_generator_and_a_figure(showers):
    proc = run_in_process("train", "--workload", "calo", "--dataset", "showers", "--framework", "torch", "--batch-sizes", "4", "--world-size", "2",
                   "--max-steps", "2", "--threads", "1", "--json", cwd=showers)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(out["run_id"])
    metrics, params = run.data.metrics, run.data.params
    assert run.info.status == "FINISHED" and out["steps"] == 2 and params["workload"] == "calo"
    assert (out["world_size"], out["strategy"], params["per_device_batch"]) == (2, "ddp", "2")
    assert out["split"]["train"][0].startswith("60 of 100") and out["split"]["test"][0].startswith("20 of 100")
    assert metrics["test_longitudinal_err"] > 0 and metrics["test_sampling_fraction_err"] > 0 and "val_longitudinal_err" in metrics
    assert run.data.tags["karman.target"] == "not reached"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)} | {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"shower_profiles.png", "model/generator.npz"} <= artifacts
    report = run_in_process("aggregate", "--runs", "all", "--name", "calo", "--json", cwd=showers)  # the ranking shows the shower metrics
    assert report.returncode == 0, report.stderr[-3000:]
    text = Path(json.loads(report.stdout.strip().splitlines()[-1])["report"]).read_text()
    ranking = text.split("calorimeter showers: frameworks and devices ranked by time to target")[1].split("##")[0]
    assert "test longitudinal max error [%]" in ranking and "test sampling-fraction max error [%]" in ranking
    assert "test accuracy [%]" not in ranking and f"{100 * metrics['test_longitudinal_err']:,.0f}" in ranking


def test_tensorflow_trains_over_two_multiworker_workers(showers):
    proc = run_in_process("train", "--workload", "calo", "--dataset", "showers", "--framework", "tensorflow", "--strategy", "multiworker",
                   "--world-size", "2", "--batch-sizes", "2", "--max-steps", "1", "--validate-every", "0", "--json", cwd=showers)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["world_size"], out["strategy"], out["steps"]) == (2, "multiworker", 1) and "2 workers" in out["device"]
    assert out["final_d_real"] > 0 and out["final_g"] > 0 and out["test_sampling_fraction_err"] > 0


def test_jax_trains_through_the_cli_is_logged_and_scores_the_test_split(showers):
    proc = run_in_process("train", "--workload", "calo", "--dataset", "showers", "--framework", "jax", "--batch-sizes", "4",
                          "--max-steps", "2", "--threads", "1", "--json", cwd=showers)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(out["run_id"])
    metrics, params = run.data.metrics, run.data.params
    assert run.info.status == "FINISHED" and out["steps"] == 2 and (params["workload"], params["framework"]) == ("calo", "jax")
    assert params["generator_parameters"] == str(parameter_counts(CPU)["generator"]["trainable"])
    assert out["final_d_real"] > 0 and out["final_g"] > 0 and "val_longitudinal_err" in metrics
    assert metrics["test_longitudinal_err"] > 0 and metrics["test_sampling_fraction_err"] > 0 and metrics["test_resolution_err"] > 0
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)} | {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"shower_profiles.png", "model/generator.npz"} <= artifacts


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "3", "--world-size", "2"], "batch size 3 does not split evenly over 2 devices"),
    (["--batch-sizes", "61"], "batch size 61 exceeds the 60 training showers of dataset 'showers'"),
])
def test_bad_batches_are_refused_in_one_line(showers, args, message):
    assert_refused(run_in_process("train", "--workload", "calo", "--dataset", "showers", "--framework", "torch", *args, cwd=showers), message)


@pytest.fixture(scope="module")
def few_showers(showers):
    """A second dataset of 30 showers beside the first (18 to train, 6 each to validate and test): epochs of three
    steps of six, each validated."""
    proc = run_in_process("generate", "--workload", "calo", "--dataset", "few", "--events", "30", "--workers", "1", "--json", cwd=showers)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return showers


# Each framework's trainer restores its state exactly from a checkpoint file (test_keras_and_jax_take_torchs_four_tape_step);
# the loop's resume, the same for every workload, is compared with an uninterrupted run in tests/tasks/train/. JAX's run is
# left out here: its three runs of the loop would compile its step three times (minutes on a 2-core host).
@pytest.mark.parametrize("framework", ("torch", "tensorflow"))
def test_a_run_stopped_by_sigterm_after_a_validated_epoch_resumes_to_its_end(few_showers, framework):
    resumes_to_its_end(few_showers, ("--workload", "calo", "--dataset", "few", "--framework", framework, "--batch-sizes", "6", "--threads", "1"),
                       epochs=3)
