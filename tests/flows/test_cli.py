"""Bad input: one clear line on stderr, a non-zero exit, nothing written."""

import pytest

from tasks.common.config.errors import UserError
from tests.conftest import run_cli, run_in_process


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
    assert_refused(run_in_process("simulate-everything", cwd=workdir), "invalid choice", "simulate-everything")


@pytest.mark.parametrize("args", [("demo", "--workload", "har"), ("bench-quality", "--workload", "karman", "--layers", "2")])
def test_an_option_the_command_does_not_take_is_refused_naming_the_command(workdir, args):
    assert_refused(run_in_process(*args, cwd=workdir), f"python -m flows {args[0]}: error: unrecognized arguments: {' '.join(args[-2:])}",
                   f"python -m flows {args[0]} --help lists its options")


def test_unknown_device(workdir):
    assert_refused(run_in_process("train", "--device", "tpu", cwd=workdir), "--device", "tpu", "cpu")


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
    assert_refused(run_in_process(*args, cwd=workdir), fragment, "greater than 0")
    assert not (workdir / "data" / "datasets").exists()


@pytest.mark.parametrize("args,fragment", [(("bench-matmul", "--sizes", ""), "no value in ''; give one or more"),
                                           (("train", "--batch-sizes", " , "), "at least 1 item"),
                                           (("benchmark", "--workloads", ","), "at least 1 item")])
def test_an_empty_list_is_refused_not_taken_for_the_default(workdir, args, fragment):
    # (bench-matmul's sizes default to [], the device's own: an empty --sizes once ran and logged the default products)
    assert_refused(run_in_process(*args, cwd=workdir), f"{args[1]}: ", fragment)
    assert not (workdir / "data").exists()


def test_an_empty_list_that_means_something_of_its_own_is_taken():
    """validate-solver's --convergence '' is no coarser resolution (its default, None, is N/4 and N/2)."""
    import argparse

    from flows.options import spec_from_args
    from tasks.workloads.karman.specs import ValidateSpec

    assert spec_from_args(ValidateSpec, argparse.Namespace(convergence=[""])).convergence == []


def test_the_demos_options_are_named_as_given_and_a_required_option_says_so(workdir):
    assert_refused(run_in_process("demo", "--time-budget", "0", cwd=workdir), "demo: error: --time-budget: Input should be greater than 0")
    shown = run_in_process("bench-frameworks", "--help", cwd=workdir)
    assert shown.returncode == 0 and "(required)" in " ".join(shown.stdout.split())


def test_a_lookup_in_a_store_not_made_yet_is_refused_and_makes_none(workdir):
    """A run, a model or an experiment asked of a local store that does not exist: refused in one line, and neither the
    store (MLflow would create it, its tables and the experiment just to look) nor the data root is left behind."""
    db = workdir / "elsewhere" / "mlflow.db"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{db}", "KARMAN_DATA_ROOT": str(workdir / "elsewhere" / "data")}
    for args, fragment in ((("train", "--resume", "0123456789abcdef0123456789abcdef"), "unknown run '0123456789abcdef0123456789abcdef'"),
                           (("infer",), "no finished training run"),
                           (("infer", "--model", "models:/nope@champion"), "has no models:/nope@champion"),
                           (("aggregate",), "experiment 'test' does not exist")):
        assert_refused(run_in_process(*args, cwd=workdir, env=env), fragment)
    assert not (workdir / "elsewhere").exists()
    import torch

    if not torch.cuda.is_available():  # a bench command's refusal too, from its child (the store is made once there are results)
        assert_refused(run_in_process("bench-matmul", "--device", "cuda", cwd=workdir, env=env), "no CUDA GPU")
        assert not (workdir / "elsewhere").exists()


def test_verify_and_overwrite_together_are_refused(workdir):
    assert_refused(run_in_process("generate", "--verify", "--overwrite", cwd=workdir), "--verify repairs the dataset and --overwrite deletes it")


def test_unwritable_data_root(workdir):
    blocker = workdir / "a-file"
    blocker.write_text("not a folder")
    proc = run_in_process("generate", cwd=workdir, env={"KARMAN_DATA_ROOT": str(blocker / "data")})
    assert_refused(proc, "data root", "not writable")


def test_obstacle_touching_a_wall_is_refused_before_any_step(workdir):
    proc = run_in_process("generate", "--y-offset", "25", cwd=workdir)
    assert_refused(proc, "touches or crosses a wall")
    assert not (workdir / "data" / "datasets").exists()


def test_unstable_relaxation_time_is_refused(workdir):
    assert_refused(run_in_process("generate", "--reynolds", "5000", cwd=workdir), "relaxation time", "stable range")


def test_training_on_a_missing_dataset(workdir):
    assert_refused(run_in_process("train", "--dataset", "nowhere", cwd=workdir), "dataset 'nowhere' not found")


def test_cuda_without_a_gpu_fails_fast(workdir):
    (workdir / "data" / "datasets" / "d").mkdir(parents=True)
    (workdir / "data" / "datasets" / "d" / "manifest.json").write_text('{"simulations": {"s": {"digest": "x"}}, "digest": "x"}')
    proc = run_in_process("train", "--dataset", "d", "--device", "cuda", cwd=workdir)
    assert_refused(proc, "cuda requested but no CUDA GPU")


def test_a_gpu_sweep_without_a_gpu_or_with_a_dask_scheduler_is_refused_before_anything_is_written(workdir):
    assert_refused(run_in_process("generate", "--device", "cuda", cwd=workdir), "cuda requested but no CUDA GPU")
    assert_refused(run_in_process("generate", "--device", "cuda", "--scheduler", "tcp://127.0.0.1:8786", cwd=workdir),
                   "--scheduler tcp://127.0.0.1:8786", "not on Dask workers")
    assert_refused(run_in_process("generate", "--workload", "digits", "--device", "cuda", cwd=workdir), "digits dataset is written on the cpu")
    # a scheduler that is not there, or no scheduler's address: refused at once (Dask would try for 30 s, then fail in a traceback)
    import socket

    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert_refused(run_in_process("generate", "--scheduler", f"tcp://127.0.0.1:{port}", cwd=workdir),
                   f"--scheduler tcp://127.0.0.1:{port}: no Dask scheduler answers there")
    assert_refused(run_in_process("generate", "--scheduler", "foo", cwd=workdir), "'foo' is not a Dask scheduler's address")
    assert not (workdir / "data").exists()
    assert_refused(run_in_process("validate-solver", "--backend", "triton", "--device", "cuda", cwd=workdir), "cuda requested but no CUDA GPU")
    assert_refused(run_in_process("validate-solver", "--dtype", "float16s", cwd=workdir), "--dtype", "'float16s'", "'float32', 'float64'")
    assert not (workdir / "data" / "datasets").exists()
    from tasks.common.process.cluster import check_scheduler

    check_scheduler("ucx://10.0.0.1:8786")  # Dask's other transports are left to Dask
    # a workload that writes its data without Dask is not held up by a scheduler it would not use
    assert run_in_process("generate", "--workload", "digits", "--scheduler", f"tcp://127.0.0.1:{port}", "--json", cwd=workdir).returncode == 0


def test_rollout_of_an_unknown_model_run(workdir):
    assert_refused(run_in_process("infer", "--model-run", "0123abcd", cwd=workdir), "unknown model run '0123abcd'")


@pytest.mark.full  # one of the slowest of its module: the full tier runs it
def test_a_report_over_runs_that_cannot_be_found_is_refused_before_anything_is_written(workdir):
    assert_refused(run_in_process("aggregate", "--runs", "yesterday", cwd=workdir), "--runs", "yesterday")
    assert_refused(run_in_process("aggregate", cwd=workdir), "experiment 'test' does not exist")
    assert not (workdir / "data" / "reports").exists()
    from mlflow.tracking import MlflowClient

    MlflowClient().create_experiment("test", artifact_location=str(workdir / "mlartifacts"))
    assert_refused(run_in_process("aggregate", "--runs", "latest", cwd=workdir), "no benchmark or demo run in experiment 'test'")
    assert_refused(run_in_process("aggregate", "--runs", "0" * 32, cwd=workdir), f"unknown run '{'0' * 32}'")


def test_a_spec_file_gives_the_whole_spec_and_the_options_beside_it_win(workdir):
    from flows.cli import build_parser, spec_file
    from flows.options import spec_from_args
    from tasks.common.specs import BenchmarkSpec, TrainSpec

    saved = workdir / "matrix.yaml"  # as prefect.yaml holds a deployment's parameters
    saved.write_text("spec:\n  batch_sizes: [4]\n  train: {epochs: 2, ngf: 8}\n  aggregate: {name: saved}\n")
    args = build_parser().parse_args(["benchmark", "--spec", str(saved), "--batch-sizes", "8"])
    spec = spec_from_args(BenchmarkSpec, args, spec_file(BenchmarkSpec, args.spec_file))
    assert (spec.batch_sizes, spec.train.epochs, spec.train.options["karman"].ngf, spec.aggregate.name) == ([8], 2, 8, "saved")
    (workdir / "train.json").write_text('{"dataset": "d", "epochs": 0}')
    (workdir / "list.json").write_text("[1, 2]")
    (workdir / "broken.yaml").write_text("a: [1\n")
    for model, name, message in ((TrainSpec, "train.json", "epochs: Input should be greater than 0 (got 0)"),
                                 (BenchmarkSpec, "list.json", "holds a list, not a mapping of the spec's fields"),
                                 (BenchmarkSpec, "broken.yaml", "is neither JSON nor YAML (while parsing a flow sequence)"),
                                 (BenchmarkSpec, "none.json", "cannot be read (No such file or directory)")):
        with pytest.raises(UserError) as refused:
            spec_file(model, str(workdir / name))
        assert str(refused.value).replace(str(workdir / name), name).startswith(f"--spec '{name}'"), refused.value
        assert message in str(refused.value)
    # through the command line: one line, exit 2, before anything starts
    assert_refused(run_in_process("train", "--spec", "train.json", cwd=workdir), "--spec 'train.json': epochs: Input should be greater than 0")
    assert_refused(run_in_process("benchmark", "--spec", str(saved), "--quick", cwd=workdir), "--spec and --quick both give the whole matrix; give one")
    assert TrainSpec.model_fields.keys().isdisjoint({"spec_file"})
