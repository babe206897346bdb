"""Each decision made once: the places that show or use a shared choice (device kinds, the default epochs, a child's environment, names, presets) take it from its one home."""

import typing

import pytest
from pydantic import ValidationError

from models.host import DEVICE_KINDS, DeviceKind
from tasks.common.specs import DEFAULT_EPOCHS, FOLDER_NAME, AggregateSpec, BenchmarkSpec, GenerateSpec, InferSpec, TrainSpec
from tasks.workloads.karman.specs import AblationSpec


def _choices(model, field: str) -> tuple:
    return typing.get_args(model.model_fields[field].annotation)


def test_device_kinds_are_named_once():
    assert DEVICE_KINDS == ("cpu", "cuda", "xla") == typing.get_args(DeviceKind)
    assert _choices(TrainSpec, "device") == _choices(InferSpec, "device") == DEVICE_KINDS
    assert typing.get_args(typing.get_args(BenchmarkSpec.model_fields["devices"].annotation)[0]) == DEVICE_KINDS
    assert set(typing.get_args(BenchmarkSpec.model_fields["pools"].annotation)[0].__args__) == set(DEVICE_KINDS)


def test_the_device_commands_offer_every_device_kind():
    from tasks.bench.specs import BenchInferSpec, BenchTrainSpec

    assert _choices(BenchTrainSpec, "device") == _choices(BenchInferSpec, "device") == DEVICE_KINDS


def test_the_default_epochs_are_the_specs():
    assert TrainSpec().epoch_limit == DEFAULT_EPOCHS
    assert TrainSpec(epochs=5).epoch_limit == 5
    assert TrainSpec(time_budget=10).epoch_limit > 10**6
    assert f"None = {DEFAULT_EPOCHS}," in TrainSpec.model_fields["epochs"].description
    from tasks.common.records import TrainRecord
    from tasks.report.capabilities import setting_label

    older = {"epochs": "None", "time_budget": "None", "max_steps": "None"}  # a run logged before records, params only
    assert f"budget {DEFAULT_EPOCHS} epochs" in setting_label(TrainRecord.from_mlflow(older, {}, finished=False))
    assert "budget 7 epochs" in setting_label(TrainRecord.from_mlflow(older | {"epochs": "7"}, {}, finished=False))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_keras_bench_step_gets_the_training_childs_environment(device, monkeypatch):
    """bench-train --framework tensorflow starts its Keras process with the environment a tensorflow
    training child gets (tasks.common.process.launch.device_env), not a copy of it."""
    import tasks.workloads.karman.bench.train as bench_train
    from tasks.bench.specs import BenchTrainSpec
    from tasks.common.process.launch import device_env

    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    seen = {}

    class Started(Exception):
        pass

    class FakeProcess:
        def __init__(self, server, config, env, what):
            seen["env"] = env
            raise Started

    monkeypatch.setattr(bench_train, "StepProcess", FakeProcess)
    with pytest.raises(Started):
        bench_train.bench_train_keras(BenchTrainSpec(framework="tensorflow", device=device, size=32, baseline=False))
    assert seen["env"] == device_env(device, framework="tensorflow")
    assert seen["env"]["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert ("CUDA_VISIBLE_DEVICES" in seen["env"]) == (device == "cpu")



def test_tensorflow_on_an_x86_cpu_takes_onednns_kernels_unless_the_user_chose(monkeypatch):
    """TensorFlow turns oneDNN on by itself only on CPUs with AVX-512 VNNI, BF16 or AMX; a CPU job of ours asks for it
    on every x86 host (docs/frameworks.md), keeps a value the user set, and a GPU job leaves it to TensorFlow."""
    import platform

    from tasks.common.process.launch import device_env

    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    assert device_env("cpu", framework="tensorflow").get("TF_ENABLE_ONEDNN_OPTS") == ("1" if x86 else None)
    assert "TF_ENABLE_ONEDNN_OPTS" not in device_env("cuda", framework="tensorflow")
    assert "TF_ENABLE_ONEDNN_OPTS" not in device_env("cpu", framework="torch") | device_env("cpu", framework="jax")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert device_env("cpu", framework="tensorflow").get("TF_ENABLE_ONEDNN_OPTS") == ("0" if x86 else None)


def _tf_functions() -> dict[str, list]:
    """Every ``tf.function(...)`` call in the project's modules, by file: its keyword arguments (name -> literal value)."""
    import ast

    from tests.conftest import ROOT
    from tests.test_layout import sources

    def literal(value: ast.expr):
        return value.value if isinstance(value, ast.Constant) else ast.unparse(value)

    calls: dict[str, list] = {}
    for path in [p for folder in ("flows", "tasks", "models", "infra") for p in sources(folder)]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "tf.function":
                calls.setdefault(path.relative_to(ROOT).as_posix(), []).append({k.arg: literal(k.value) for k in node.keywords})
    return calls


def test_the_projects_tf_functions_are_traced_without_autograph_and_the_tutorials_reference_with_it():
    """Our own steps branch on Python values only: each tf.function says autograph=False (no source conversion at each
    trace, no converted source left in the temporary folder). The TensorFlow reference is the tutorial's code, as written."""
    calls = _tf_functions()
    references = {path: found for path, found in calls.items() if "/references/" in path}
    ours = {path: found for path, found in calls.items() if path not in references}
    assert "models/karman/nets/trainer_keras.py" in ours and "tasks/workloads/calo/tensorflow.py" in ours  # the scan finds them
    assert {path: [c for c in found if c.get("autograph") is not False] for path, found in ours.items()} == {path: [] for path in ours}
    assert references and all("autograph" not in c for found in references.values() for c in found)

NAMED_FOLDERS = [(GenerateSpec, "dataset"), (TrainSpec, "dataset"), (InferSpec, "dataset"), (AggregateSpec, "name"), (AblationSpec, "name")]


@pytest.mark.parametrize("model, field", NAMED_FOLDERS)
def test_every_folder_name_follows_the_one_pattern(model, field):
    assert model.model_fields[field].metadata[0].pattern == FOLDER_NAME
    assert getattr(model(**{field: "re-100_v2.1"}), field) == "re-100_v2.1"
    for bad in ("../up", ".hidden", "a/b", "x" * 65, ""):
        with pytest.raises(ValidationError):
            model(**{field: bad})


@pytest.mark.parametrize("spec, mlflow_name, prefect_name", [
    (TrainSpec(batch_sizes=[8]), "karman-torch-cpu-b8", "train karman torch cpu b8"),
    (TrainSpec(workload="digits", framework="tensorflow", device="cuda", batch_sizes=[16], seed=2), "digits-tensorflow-cuda-b16-s2",
     "train digits tensorflow cuda b16 s2"),
    (TrainSpec(workload="har", framework="jax", batch_sizes=[64], layers=1, units=16), "har-jax-cpu-b64-l1u16", "train har jax cpu b64 l1u16"),
])
def test_a_training_run_has_one_name_in_mlflow_and_prefect(spec, mlflow_name, prefect_name):
    from types import SimpleNamespace

    from flows import pipeline
    from tasks.common.tracking.names import train_label, train_run_name
    from tasks.train.task import train_model

    assert train_run_name(spec, spec.batch_sizes[0]) == mlflow_name
    assert train_label(spec) == prefect_name
    assert train_model.task_run_name(parameters={"plan": SimpleNamespace(spec=spec), "batch_size": spec.batch_sizes[0]}) == prefect_name
    assert pipeline._cell_label("train", spec) == prefect_name
    assert train_label(spec.model_copy(update={"batch_sizes": [4, 8]})).startswith(prefect_name.replace(f"b{spec.batch_sizes[0]}", "b4,8"))


def test_a_sweep_and_a_resumed_run_say_so():
    from tasks.common.tracking.names import sweep_run_name, train_label

    spec = TrainSpec(framework="tensorflow", batch_sizes=[4, 8])
    assert sweep_run_name(spec) == "sweep-karman-tensorflow-cpu-b4,8"
    assert train_label(spec, [8]) == "train karman tensorflow cpu b8"
    # a resume request knows only the run: not the framework, device and batch that TrainSpec's defaults would name
    assert train_label(TrainSpec(resume="0123abcd" * 4)) == "train resume 0123abcd"


def test_a_rollout_has_one_name_in_mlflow_and_prefect():
    from flows import pipeline
    from tasks.common.tracking.names import infer_label, infer_run_name
    from tasks.infer.task import rollout

    spec = InferSpec(mode="mapreduce", workers=2)
    assert infer_run_name(spec) == "infer-torch-mapreduce-cpu-w2" and infer_run_name(spec, "tensorflow") == "infer-tensorflow-mapreduce-cpu-w2"
    assert infer_label(spec) == rollout.task_run_name(parameters={"spec": spec}) == pipeline._cell_label("infer", spec) == "infer mapreduce cpu x2"
    named = spec.model_copy(update={"model_run": "0123abcd" * 4})  # a benchmark's cell: one model per framework
    assert infer_label(named) == "infer mapreduce cpu x2 model 0123abcd"


def test_no_two_runs_of_a_benchmark_share_a_name_and_each_says_what_ran():
    """Every training cell of a benchmark over every workload, framework, seed and har size, named as the flow names them."""
    from flows.matrix import plan_benchmark
    from tasks.common.tracking.names import train_label, train_run_name

    bench = BenchmarkSpec(workloads=["karman", "digits", "har", "calo"], frameworks=["torch", "tensorflow", "jax"], devices=["cpu"],
                          batch_sizes=[8, 16], repeats=2, layers=[1, 2], units=[16])
    names, labels = [], []
    for planned in plan_benchmark(bench).workloads:
        for job in planned.train:
            cell, batch, framework = job.spec, job.shown["batch_size"], job.shown["framework"]
            names.append(train_run_name(cell, batch))
            labels.append(train_label(cell))
            assert names[-1].startswith(f"{planned.cells.workload.name}-{framework}-cpu-b{batch}") and labels[-1].startswith(f"train {planned.cells.workload.name} {framework}")
    assert len(names) == len(set(names)) == len(set(labels)) == 2 * 2 * (3 + 3 + 3 * 2 + 3)  # every workload in 3 frameworks, har: 2 sizes


def test_the_quick_matrix_is_its_preset():
    from tasks.workloads.presets import benchmark_preset, presets, quick_benchmark

    quick = quick_benchmark()
    assert quick == benchmark_preset("quick") == BenchmarkSpec.model_validate(presets()["quick"])
    assert (quick.batch_sizes, quick.train.epochs, quick.infer.steps, quick.aggregate.name) == (None, None, 40, "quick")
    from flows.matrix import benchmark_matrix

    def sizes(bench: BenchmarkSpec) -> dict:
        return {m.workload.name: (m.batch_sizes, m.epochs) for m in benchmark_matrix(bench.model_copy(update={"workloads": ["karman", "digits"]}))}

    # karman's cells at the demo's sizes; every other workload at its own (digits: batch 64, 8 epochs)
    assert sizes(quick) == {"karman": ([4, 8], 3), "digits": ([64], 8)}
    assert sizes(quick.model_copy(update={"batch_sizes": [16]})) == {"karman": ([16], 3), "digits": ([16], 8)}  # the user's, for every workload
    with pytest.raises(ValueError, match="unknown benchmark preset 'fast'; choose one of quick, frameworks, seeds-quick"):
        benchmark_preset("fast")
