"""The benchmark flow's matrix, cell by cell, against real servers and stores.

The benchmark flow in process against a real Prefect API, a real Dask cluster, real zarr stores and
a real MLflow store: every cell its own flow run, reruns skip finished cells, a failed cell fails
alone and shows in the report; bad matrices are refused."""

import shutil

import pytest
from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from tasks.common.specs import AggregateSpec, BenchmarkSpec, GenerateSpec, InferOptions, TrainOptions
from tasks.workloads.presets import quick_benchmark
from tests.conftest import run_in_process, write_sweep
from tests.flows.test_cli import assert_refused

TINY = BenchmarkSpec(
    generate=GenerateSpec(dataset="tiny", reynolds=[40.0, 50.0, 60.0], nx=64, ny=32, size=[6.0], warmup_steps=1500,
                          frames=10, frame_every=40, workers=2),
    train=TrainOptions(dataset="tiny", ngf=8, ndf=8, epochs=1, threads=1),
    batch_sizes=[4, 500],  # 500 is more than the training pairs: that cell fails, the others go on
    infer=InferOptions(steps=3, halo=4),
    modes=["full", "mapreduce"], workers=[1, 2],
    repeats=1,  # one run a cell (the workload's run rules would give karman five)
    aggregate=AggregateSpec(name="tiny-bench"),
)


@pytest.fixture(scope="module")
def tiny_datasets(tmp_path_factory):
    """TINY's dataset, simulated once for the module (the sweep itself is tests/flows/test_generate.py's subject):
    each benchmark below finds it complete, as a benchmark on a team's shared data root does."""
    root = tmp_path_factory.mktemp("bench-data")
    write_sweep(root, TINY.generate.spec_of("karman"))
    return root


@pytest.fixture
def workdir(workdir, tiny_datasets):
    shutil.copytree(tiny_datasets / "datasets", workdir / "data" / "datasets")
    return workdir


def test_benchmark_runs_every_cell_then_skips_the_finished_ones(workdir, prefect_harness):
    from flows import pipeline

    first = pipeline.benchmark(TINY)
    status = {(c["kind"], c.get("batch_size"), c.get("mode"), c.get("workers")): c["status"] for c in first["cells"]}
    assert status == {("train", 4, None, None): "FINISHED", ("train", 500, None, None): "FAILED",
                      ("infer", None, "full", 1): "FINISHED", ("infer", None, "mapreduce", 1): "FINISHED",
                      ("infer", None, "mapreduce", 2): "FINISHED"}
    assert first["failed"] == 1
    trained = next(c["run_id"] for c in first["cells"] if c["kind"] == "train" and c["status"] == "FINISHED")
    # one epoch on ten frames holds the flow for far fewer than the floor's 20 steps: no model registered, none champion
    assert (first["registered"]["version"], first["registered"]["run_id"], first["registered"]["champion"]) == (None, trained, False)
    assert "no model registered" in first["registered"]["reason"] and "fewer than 20 steps" in first["registered"]["reason"]
    failed = next(c for c in first["cells"] if c["status"] == "FAILED")
    assert "batch size 500" in failed["error"]
    report = (workdir / "data" / "reports" / "tiny-bench" / "report.md").read_text()
    assert "FAILED" in report and "| cpu | mapreduce | 2 |" in report
    # the --json summary and the benchmark's MLflow run carry each training cell's medians with their intervals and n
    import json

    from flows.cli import COMMANDS

    summary = json.loads(json.dumps(COMMANDS["benchmark"].summary(first)))
    (cell,) = summary["intervals"]  # the batch-500 cell failed: no figures
    assert (cell["workload"], cell["framework"], cell["batch_size"], cell["runs"]) == ("karman", "torch", 4, 1)
    assert cell["samples_per_s"]["n"] == 1 and cell["samples_per_s"]["median"] > 0 and cell["samples_per_s"]["low"] is None
    assert set(cell) >= {"time_to_target_s", "test_accuracy", "mfu_ceiling", "energy_j"}
    metrics = MlflowClient().get_run(first["benchmark_run_id"]).data.metrics
    assert metrics["karman torch cpu x1 b4 samples_per_s median"] == cell["samples_per_s"]["median"]
    assert metrics["karman torch cpu x1 b4 runs"] == 1 and "karman torch cpu x1 b4 samples_per_s low" not in metrics
    assert "(1 run: no interval)" in report
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    keys = ["tiny-bench-report", "tiny-bench-training", "tiny-bench-inference"]
    with get_client(sync_client=True) as prefect:
        artifacts = {a.key: a for a in prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)))}
    assert set(artifacts) == set(keys)
    with get_client(sync_client=True) as prefect:  # published once, on the benchmark's own flow run
        versions = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)))
        owners = {prefect.read_flow_run(a.flow_run_id).name for a in versions}
    assert sorted(a.key for a in versions) == sorted(keys) and owners == {"benchmark tiny-bench"}
    assert artifacts["tiny-bench-report"].type == "markdown" and "Training: device × batch size" in artifacts["tiny-bench-report"].data
    assert artifacts["tiny-bench-inference"].type == "table"

    client = MlflowClient()
    experiment = client.get_experiment_by_name("test").experiment_id
    runs_before = {r.info.run_id for r in client.search_runs([experiment])}
    again = pipeline.benchmark(TINY)
    again_status = {c["cell"]: c["status"] for c in again["cells"]}
    assert {c["cell"]: c["status"] for c in first["cells"] if c["status"] == "FINISHED"} == {
        k: "FINISHED" for k, v in again_status.items() if v == "SKIPPED"}
    new_runs = [client.get_run(r) for r in {r.info.run_id for r in client.search_runs([experiment])} - runs_before]
    # only the failed cell is tried again (and fails again), plus the new report's run
    assert sorted(r.data.tags["karman.stage"] for r in new_runs) == ["aggregate", "benchmark", "generate", "train"]
    assert again["registered"]["version"] is None and "no model registered" in again["registered"]["reason"]
    assert not MlflowClient().search_registered_models()  # nothing useless was registered
    finished_ids = {c["run_id"] for c in first["cells"] if c["status"] == "FINISHED"}
    assert finished_ids == {c["run_id"] for c in again["cells"] if c["status"] == "SKIPPED"}


def test_a_matrix_with_no_cells_is_refused():
    with pytest.raises(ValidationError, match="the rollout matrix has no cells"):
        BenchmarkSpec(modes=["full"], workers=[2])
    with pytest.raises(ValidationError, match="repeats 8"):
        BenchmarkSpec(batch_sizes=[8, 8])
    with pytest.raises(ValidationError, match="is not a work-pool name"):
        BenchmarkSpec(pools={"cuda": "gpu pool"})


@pytest.mark.parametrize("args, fragments", [
    (("--modes", "full", "--workers", "2"), ("the rollout matrix has no cells",)),
    (("--devices", "gpu"), ("--devices", "'cpu', 'cuda' or 'xla'")),
    (("--batch-sizes", "0"), ("--batch-sizes", "greater than 0")),
    (("--devices", "cuda"), ("deployment(s) train/gpu not found",)),
    (("--devices", "cpu,cuda", "--pools", "cuda=nope"), ("deployment(s) train/nope not found",)),
    (("--pools", "gpu=x"), ("--pools", "'cpu', 'cuda' or 'xla'")),
    (("--pools", "cuda"), ("--pools: 'cuda' is not a list of KEY=VALUE pairs",)),
    (("--pools", "cuda=a b"), ("pool 'a b' of device cuda is not a work-pool name",)),
])
def test_bad_benchmark_requests_are_refused_with_one_line(workdir, args, fragments):
    assert_refused(run_in_process("benchmark", "--quick", *args, cwd=workdir), *fragments)


def test_a_gpu_sweep_is_the_gpu_pools_dataset_cell(monkeypatch):
    from flows.matrix import benchmark_matrix, check_deployments, deployment_for
    from tasks.common.config.errors import UserError

    spec = quick_benchmark().model_copy(update={"generate": quick_benchmark().generate.model_copy(update={"device": "cuda"}), "pools": {"cuda": "gpu"}})
    assert deployment_for("generate", spec.generate.device, spec.pools) == "generate/gpu"
    assert deployment_for("generate", "cpu", spec.pools) is None  # a cpu sweep runs where the benchmark runs
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with pytest.raises(UserError, match=r"deployment\(s\) generate/gpu not found"):
        check_deployments(spec, benchmark_matrix(spec))


def test_a_training_cell_killed_after_a_validated_epoch_is_resumed_by_the_next_benchmark(workdir, prefect_harness):
    import signal

    from flows import pipeline
    from flows.matrix import plan_benchmark
    from tasks.common.tracking.cells import cell_key
    from tests.tasks.train.interrupt import stop_after_epoch

    spec = TINY.model_copy(update={"train": TINY.train.model_copy(update={"epochs": 3, "validate_every": 1}), "batch_sizes": [4],
                                   "modes": ["full"], "workers": [1]})
    digest = pipeline.generate(spec.generate.spec_of("karman"))["digest"]
    cell = plan_benchmark(spec).workloads[0].train[0].spec  # the benchmark's one training cell
    key = cell_key("train/torch", cell, digest)
    killed = stop_after_epoch(workdir, ("--dataset", spec.generate.dataset, "--ngf", "8", "--ndf", "8", "--epochs", "3", "--threads", "1",
                                        "--batch-sizes", "4", "--validate-every", "1", "--cell", key), 1, signal.SIGKILL)
    assert MlflowClient().get_run(killed).info.status == "RUNNING"  # SIGKILL left it open

    result = pipeline.benchmark(spec)
    train_cell = next(c for c in result["cells"] if c["kind"] == "train")
    assert train_cell["cell"] == key and train_cell["status"] == "FINISHED"
    assert train_cell["run_id"] == killed  # the same run, continued from its checkpoint
    history = MlflowClient().get_metric_history(killed, "epoch_time_s")
    assert len({m.step for m in history}) == 3  # every epoch, the ones before the kill and after


def test_both_frameworks_are_compared_cell_by_cell_and_a_rerun_skips_the_tensorflow_cells(workdir, prefect_harness):
    from flows import pipeline

    spec = TINY.model_copy(update={"frameworks": ["torch", "tensorflow"], "batch_sizes": [4], "modes": ["full"], "workers": [1],
                                   "aggregate": AggregateSpec(name="frameworks")})
    first = pipeline.benchmark(spec)
    status = {(c["kind"], c["framework"]): c["status"] for c in first["cells"]}
    assert status == {("train", "torch"): "FINISHED", ("train", "tensorflow"): "FINISHED",
                      ("infer", "torch"): "FINISHED", ("infer", "tensorflow"): "FINISHED"}
    client = MlflowClient()
    trained = {c["framework"]: client.get_run(c["run_id"]) for c in first["cells"] if c["kind"] == "train"}
    assert {f: r.data.params["framework"] for f, r in trained.items()} == {"torch": "torch", "tensorflow": "tensorflow"}
    rolled = [client.get_run(c["run_id"]) for c in first["cells"] if c["kind"] == "infer"]
    # each framework's own model is rolled out
    assert {r.data.tags["karman.model_run"] for r in rolled} == {r.info.run_id for r in trained.values()}
    report = (workdir / "data" / "reports" / "frameworks" / "report.md").read_text()
    side = report.split("## Frameworks side by side")[1].split("###")[0]
    assert "| cpu x1 | 4 | torch | single | 1 |" in side and "| cpu x1 | 4 | tensorflow | default | 1 |" in side
    again = pipeline.benchmark(spec)
    assert {(c["kind"], c["framework"]): c["status"] for c in again["cells"]} == {k: "SKIPPED" for k in status}
    assert {c["run_id"] for c in again["cells"]} == {c["run_id"] for c in first["cells"]}


def test_a_har_sweep_of_layers_by_units_is_one_matrix_and_other_workloads_ignore_it():
    from flows.matrix import benchmark_matrix

    spec = quick_benchmark().model_copy(update={"workloads": ["har", "digits"], "frameworks": ["torch", "tensorflow"],
                                                    "layers": [1, 2], "units": [16, 32, 64]})
    har, digits = benchmark_matrix(spec)
    assert har.sizes == [{"layers": l, "units": u} for l in (1, 2) for u in (16, 32, 64)]
    assert har.batch_sizes == [64] and digits.batch_sizes == [64]  # quick sizes karman's cells only: these take their own
    assert har.train_cells(spec) == 2 * 1 * len(har.batch_sizes) * 6 * spec.repeats  # frameworks x devices x batch sizes x sizes
    assert digits.sizes == [{}]  # the CNN has no such axes
    assert benchmark_matrix(spec.model_copy(update={"layers": None, "units": None}))[0].sizes == [{}]
    with pytest.raises(ValidationError, match="layers"):
        BenchmarkSpec(layers=[0])


def test_a_benchmark_without_repeats_trains_each_cell_as_often_as_its_workloads_run_rules_ask():
    from flows.matrix import plan_benchmark
    from tasks.workloads import get_workload

    plan = plan_benchmark(BenchmarkSpec(workloads=["digits", "har"], frameworks=["torch", "jax"]))
    for part in plan.workloads:
        runs = get_workload(part.cells.workload.name).rules.runs
        assert part.cells.repeats == runs == 5
        seeds = sorted(job.spec.seed for job in part.train if job.spec.framework == "torch")
        assert seeds == list(range(runs))  # seeds 0..4 of each cell
    assert "5 seed(s) each" in plan.description
    assert {p.cells.repeats for p in plan_benchmark(BenchmarkSpec(workloads=["digits"], repeats=2)).workloads} == {2}
    assert {p.cells.repeats for p in plan_benchmark(quick_benchmark().model_copy(update={"workloads": ["digits"]})).workloads} == {1}
