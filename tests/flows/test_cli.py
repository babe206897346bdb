"""Bad input: one clear line on stderr, a non-zero exit, nothing written."""

import pytest

from tests.conftest import run_cli


def assert_refused(proc, *fragments):
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_help_lists_the_commands(workdir):
    proc = run_cli("--help", cwd=workdir)
    assert proc.returncode == 0
    for command in ("demo", "generate", "train", "infer", "aggregate"):
        assert command in proc.stdout


def test_unknown_command(workdir):
    assert_refused(run_cli("simulate-everything", cwd=workdir), "invalid choice", "simulate-everything")


def test_unknown_device(workdir):
    assert_refused(run_cli("train", "--device", "tpu", cwd=workdir), "--device", "tpu", "cpu")


@pytest.mark.parametrize(
    "args,fragment",
    [
        (("train", "--batch-sizes", "0"), "--batch-sizes"),
        (("train", "--epochs", "-1"), "--epochs"),
        (("generate", "--nx", "0"), "--nx"),
        (("generate", "--frames", "0"), "--frames"),
        (("generate", "--size", "-3"), "--size"),
        (("generate", "--reynolds", "100,-5"), "--reynolds"),
        (("infer", "--steps", "0"), "--steps"),
    ],
)
def test_zero_or_negative_sizes(workdir, args, fragment):
    assert_refused(run_cli(*args, cwd=workdir), fragment, "greater than 0")
    assert not (workdir / "data" / "datasets").exists()


def test_unwritable_data_root(workdir):
    blocker = workdir / "a-file"
    blocker.write_text("not a folder")
    proc = run_cli("generate", cwd=workdir, env={"KARMAN_DATA_ROOT": str(blocker / "data")})
    assert_refused(proc, "data root", "not writable")


def test_obstacle_touching_a_wall_is_refused_before_any_step(workdir):
    proc = run_cli("generate", "--y-offset", "25", cwd=workdir)
    assert_refused(proc, "touches or crosses a wall")
    assert not (workdir / "data" / "datasets").exists()


def test_unstable_relaxation_time_is_refused(workdir):
    assert_refused(run_cli("generate", "--reynolds", "5000", cwd=workdir), "relaxation time", "stable range")


def test_training_on_a_missing_dataset(workdir):
    assert_refused(run_cli("train", "--dataset", "nowhere", cwd=workdir), "dataset 'nowhere' not found")


def test_cuda_without_a_gpu_fails_fast(workdir):
    (workdir / "data" / "datasets" / "d").mkdir(parents=True)
    (workdir / "data" / "datasets" / "d" / "manifest.json").write_text('{"simulations": {"s": {"digest": "x"}}, "digest": "x"}')
    proc = run_cli("train", "--dataset", "d", "--device", "cuda", cwd=workdir)
    assert_refused(proc, "cuda requested but no CUDA GPU")


def test_a_gpu_sweep_without_a_gpu_or_with_a_dask_scheduler_is_refused_before_anything_is_written(workdir):
    assert_refused(run_cli("generate", "--device", "cuda", cwd=workdir), "cuda requested but no CUDA GPU")
    assert_refused(run_cli("generate", "--device", "cuda", "--scheduler", "tcp://127.0.0.1:8786", cwd=workdir),
                   "--scheduler tcp://127.0.0.1:8786", "not on Dask workers")
    assert_refused(run_cli("generate", "--workload", "digits", "--device", "cuda", cwd=workdir), "digits dataset is written on the cpu")
    assert_refused(run_cli("validate-solver", "--backend", "triton", "--device", "cuda", cwd=workdir), "cuda requested but no CUDA GPU")
    assert_refused(run_cli("validate-solver", "--dtype", "float16s", cwd=workdir), "float16s is offered by the triton backend only")
    assert not (workdir / "data" / "datasets").exists()


def test_rollout_of_an_unknown_model_run(workdir):
    assert_refused(run_cli("infer", "--model-run", "0123abcd", cwd=workdir), "unknown model run '0123abcd'")


@pytest.mark.full  # one of the slowest of its module: the full tier runs it
def test_a_report_over_runs_that_cannot_be_found_is_refused_before_anything_is_written(workdir):
    assert_refused(run_cli("aggregate", "--runs", "yesterday", cwd=workdir), "--runs", "yesterday")
    assert_refused(run_cli("aggregate", cwd=workdir), "experiment 'test' does not exist")
    assert not (workdir / "data" / "reports").exists()
    from mlflow.tracking import MlflowClient

    MlflowClient().create_experiment("test", artifact_location=str(workdir / "mlartifacts"))
    assert_refused(run_cli("aggregate", "--runs", "latest", cwd=workdir), "no benchmark or demo run in experiment 'test'")
    assert_refused(run_cli("aggregate", "--runs", "0" * 32, cwd=workdir), f"unknown run '{'0' * 32}'")
