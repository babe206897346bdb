"""bench-frameworks: each idiomatic reference computes our loss from our weights and takes our optimiser step; the command's JSON on a tiny run; bad input refused in one line with exit 2, before any child starts."""

import shutil
from collections.abc import Callable

import pytest

from tasks.common.specs import GenerateSpec
from tests.conftest import run_cli, run_in_process, strict_json, write_sweep
from tests.workloads.digits_step import stepped_when_asked

FRAMEWORKS = ("torch", "tensorflow", "jax")


# a tiny sweep: one training simulation of 64x32 cells, 8 frames (5 pairs of a three-step loss)
KARMAN_TINY = GenerateSpec(dataset="karman-tiny", reynolds=[40.0, 50.0, 60.0], nx=64, ny=32, size=[6.0], warmup_steps=400, frames=8, frame_every=20)


@pytest.fixture(scope="module")
def karman_root(tmp_path_factory):
    """A data root holding the tiny karman sweep."""
    root = tmp_path_factory.mktemp("karman-data")
    write_sweep(root, KARMAN_TINY)
    return root


@pytest.fixture(scope="module")
def stepped(karman_root) -> Callable[[str], dict]:
    """A framework's results (in a process of its own), per workload: ours and the reference's losses before and after one
    step; taken when a test first asks for that framework's and kept for the module, so that no one test waits for all
    three children (2 min 39 s in one setup on a slow host)."""
    karman = {"KARMAN_DATA_ROOT": str(karman_root), "KARMAN_DATASET": KARMAN_TINY.dataset}
    return stepped_when_asked("tests.tasks.bench.frameworks_step", env=karman)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("workload", ["digits", "har", "karman"])
def test_each_reference_computes_our_loss_and_takes_our_step_from_the_same_weights(stepped, workload, framework):
    r = stepped(framework)[workload]
    # the tolerances of the cross-framework tests (tests/workloads/test_har_workload.py, test_digits_workload.py)
    assert r["before"]["reference"] == pytest.approx(r["before"]["ours"], abs=1e-5)  # the same network from the same weights
    assert r["after"]["ours"] < r["before"]["ours"] - 0.01  # the step learned something
    # karman: Adam's first step moves every weight by about ±lr whatever the size of its gradient, so rounding in the
    # gradients near zero moves the loss after it: ours in TensorFlow moves by 6e-5 (of 2.77) with oneDNN's kernels on or off
    after = 2e-4 if workload == "karman" else 1e-5
    assert r["after"]["reference"] == pytest.approx(r["after"]["ours"], abs=after)  # the same optimiser step
    assert r["seconds"] > 0


def _digits_dataset(workdir):
    from tasks.workloads.digits.workload import write_dataset

    write_dataset(workdir / "data" / "datasets" / "digits")


def test_a_tiny_run_prints_ours_and_the_references_samples_per_s_and_their_ratio(workdir):
    _digits_dataset(workdir)
    proc = run_in_process("bench-frameworks", "--workload", "digits", "--steps", "2", "--repeats", "2", "--profile", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = strict_json(proc.stdout.strip().splitlines()[-1])
    assert (out["workload"], out["dataset"], out["batch_size"], out["repeats"], out["synthetic"]) == ("digits", "digits", 64, 2, False)
    assert out["cpu_name"] and set(out["load_average"]) == {"before", "after"}
    assert list(out["frameworks"]) == list(FRAMEWORKS)
    for framework, row in out["frameworks"].items():
        assert row["steps"] == 2 and row["train_samples"] == 3500, framework
        assert len(row["samples_per_s_runs"]) == len(row["reference_samples_per_s_runs"]) == 2
        a, b = row["samples_per_s_runs"]
        assert row["samples_per_s"] == pytest.approx(2 / (1 / a + 1 / b), rel=1e-3)  # the median of two blocks' seconds
        assert row["ratio"] == pytest.approx(row["samples_per_s"] / row["reference_samples_per_s"])
        assert row["ratio_of_pairs_median"] == pytest.approx(sum(row["ratio_runs"]) / 2, rel=1e-3)  # each repeat's pair of blocks
        assert row["first_loss"]["reference"] == pytest.approx(row["first_loss"]["ours"], abs=1e-5)
        assert row["reference"] and row["version"]
        for side in ("ours", "reference"):  # one more block of each under the framework's profiler: its busiest ops
            profile = row["profile"][side]
            assert profile["busy_ms_per_step"] > 0 and 0 < len(profile["ops"]) <= 8, (framework, side)
            assert sum(op["share"] for op in profile["ops"]) <= 1.0001
            assert [op["ms_per_step"] for op in profile["ops"]] == sorted((op["ms_per_step"] for op in profile["ops"]), reverse=True)
    assert any(op["op"].startswith("aten::") for op in out["frameworks"]["torch"]["profile"]["ours"]["ops"])  # torch.profiler's operators


def test_a_tiny_karman_run_trains_the_default_recipe_against_its_references(workdir, karman_root):
    shutil.copytree(karman_root / "datasets", workdir / "data" / "datasets")
    # torch alone: the step test above takes each framework's reference through the same interface
    proc = run_in_process("bench-frameworks", "--workload", "karman", "--dataset", KARMAN_TINY.dataset, "--frameworks", "torch", "--batch-size", "2",
                          "--steps", "1", "--repeats", "1", "--threads", "1", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = strict_json(proc.stdout.strip().splitlines()[-1])
    assert (out["workload"], out["dataset"], out["batch_size"], out["synthetic"]) == ("karman", "karman-tiny", 2, False)
    assert list(out["frameworks"]) == ["torch"]
    for framework, row in out["frameworks"].items():
        assert row["steps"] == 1 and row["train_samples"] == 5, framework
        assert row["first_loss"]["reference"] == pytest.approx(row["first_loss"]["ours"], abs=1e-5), framework
        assert row["samples_per_s"] > 0 and row["reference_samples_per_s"] > 0 and row["reference"], framework


def test_self_time_is_an_events_duration_less_the_events_nested_in_it_on_its_thread():
    from tasks.bench.profiles import self_times

    thread_a = [("step", 0, 10), ("dot", 2, 3), ("fusion", 6, 2), ("copy", 20, 1)]  # dot and fusion inside step; copy after it
    thread_b = [("step", 0, 4)]
    assert self_times([thread_a, thread_b]) == {"step": (10 - 3 - 2 + 4, 2), "dot": (3, 1), "fusion": (2, 1), "copy": (1, 1)}


@pytest.mark.parametrize("args, message", [
    (["--workload", "calo"], "--workload: bench-frameworks has idiomatic references for digits, har, karman only (got 'calo')"),
    (["--workload", "digits", "--frameworks", "torch,mxnet"], "--frameworks: Input should be 'torch', 'tensorflow' or 'jax' (got 'mxnet')"),
    (["--workload", "digits", "--dataset", "absent"], "no digits dataset 'absent' in"),
    (["--workload", "digits", "--batch-size", "0"], "--batch-size: 0 must be a positive integer (got '0')"),
])
def test_bad_input_is_one_line_and_exit_2_with_nothing_started(workdir, args, message):
    proc = run_cli("bench-frameworks", *args, "--json", cwd=workdir)
    assert proc.returncode == 2
    assert proc.stdout == ""
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("python -m flows bench-frameworks: error: ") and message in line, line


def test_the_command_process_imports_no_framework(workdir):
    """The parent checks the request and the dataset, and starts its children, without loading torch, TensorFlow or JAX."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    _digits_dataset(workdir)
    code = ("import sys\n"
            "import tasks.bench.frameworks as f\n"
            "from tasks.bench.specs import BenchFrameworksSpec\n"
            "spec = BenchFrameworksSpec(workload='digits')\n"
            "print(f._check_dataset(spec, 64)[0], f.train_spec(spec, 'jax', 64).framework)\n"
            "import tasks.common.process.launch, tasks.common.measures.ceiling\n"
            "print([m for m in ('torch', 'tensorflow', 'keras', 'jax', 'prefect', 'mlflow') if m in sys.modules])\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["digits jax", "[]"]
