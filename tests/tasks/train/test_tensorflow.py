"""The TensorFlow version of training and rollouts through the CLI.

The TensorFlow version through the CLI, as a user runs it: Keras Pix2Pix under the default strategy, MirroredStrategy
over two logical CPUs and MultiWorkerMirroredStrategy over two local processes; the same MLflow names as a torch
run; a logged Keras model; resume after SIGTERM and SIGKILL past validated epochs; rollouts of the model full-frame and map-reduce. Real zarr data,
a real MLflow store, real child processes (TensorFlow never enters the test process)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from tasks.common.tracking.names import Tag
from tests.conftest import run_in_process
from tests.flows.test_cli import assert_refused
from tests.tasks.train.interrupt import assert_same_result, stopped_and_resumed
from tests.tasks.train.test_training import NET, client, dataset_root, train, trainable  # noqa: F401

TF = ("--framework", "tensorflow")
WHOLE = (*NET, "--epochs", "4", "--batch-sizes", "4", "--validate-every", "1")  # every checkpoint holds a validation
PHASES = {"forward_s", "backward_s", "optimizer_s"}  # torch's step split; a tf.function is one call


def keras_weights(workdir, *run_ids: str) -> list[list[np.ndarray]]:
    """The trained generators' weights (every variable, moving statistics too), one list per run in the order of their
    paths, read from each logged Keras file's weights (an HDF5 file in its zip) without TensorFlow."""
    import io
    import zipfile

    import h5py

    weights = []
    for run_id in run_ids:
        model = workdir / "data" / "runs" / run_id / "model" / "generator.keras"
        arrays: dict[str, np.ndarray] = {}
        with zipfile.ZipFile(model) as archive, h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as stored:
            stored.visititems(lambda name, item: arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
        assert arrays, f"no weights in {model}"
        weights.append([arrays[name] for name in sorted(arrays)])
    return weights


@pytest.fixture(scope="module")
def trained(module_workdir, dataset_root):
    """A store with a torch run and a TensorFlow run of the same network; the TensorFlow run (four epochs) is also
    the uninterrupted run that a killed and resumed one must end equal to."""
    shutil.copytree(dataset_root / "datasets", module_workdir / "data" / "datasets")
    torch_out = train(module_workdir, *NET, "--epochs", "2", "--batch-sizes", "4")
    tf_out = train(module_workdir, *TF, *WHOLE)
    return module_workdir, torch_out, tf_out


def test_tensorflow_trains_with_torchs_names_logs_a_keras_model_and_rolls_out_full_and_tiled(trained):
    trainable, torch_out, tf_out = trained
    assert tf_out["strategy"] == "default" and tf_out["world_size"] == 1 and np.isfinite(tf_out["final_l1"])
    torch_run, tf_run = client().get_run(torch_out["run_id"]), client().get_run(tf_out["run_id"])
    p, m = tf_run.data.params, tf_run.data.metrics
    assert (p["framework"], p["strategy"], p["world_size"], p["batch_size"]) == ("tensorflow", "default", "1", "4")
    assert p["tensorflow_version"] == p["framework_version"] and json.loads(p["speed"])["jit_compile"] is False
    # the same networks and the same names: a TensorFlow cell compares with a torch cell column by column
    assert (p["generator_params"], p["discriminator_params"]) == (torch_run.data.params["generator_params"], torch_run.data.params["discriminator_params"])
    assert set(torch_run.data.params) - set(p) == {"torch_version", "precision", "channels_last", "winograd"} - set(p)
    assert set(torch_run.data.metrics) - PHASES - {k for k in torch_run.data.metrics if k.startswith("system/")} <= set(m)
    assert tf_run.data.tags[Tag.FRAMEWORK] == "tensorflow" and tf_run.info.run_name == "karman-tensorflow-cpu-b4"
    artifacts = {a.path for a in client().list_artifacts(tf_out["run_id"], "model")}
    assert {"model/generator.keras", "model/meta.json"} <= artifacts
    meta = json.loads((trainable / "data" / "runs" / tf_out["run_id"] / "model" / "meta.json").read_text())
    assert meta["framework"] == "tensorflow" and meta["weights_file"] == "generator.keras"
    # the logged MLflow model loads with MLflow's own API (in a child: TensorFlow stays out of this process)
    uri = tf_run.data.tags[Tag.MODEL_URI]
    script = ("import sys, numpy as np, mlflow.tensorflow; m = mlflow.tensorflow.load_model(sys.argv[1], dst_path=sys.argv[2]); "
              "print(sum(int(np.prod(w.shape)) for w in m.trainable_weights), m(np.zeros((1, 32, 64, 4), 'float32')).shape)")
    loaded = subprocess.run([sys.executable, "-c", script, uri, tempfile.mkdtemp(dir=trainable)], capture_output=True, text=True, cwd=trainable,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""})
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split()[0] == p["generator_params"] and loaded.stdout.strip().endswith("(1, 32, 64, 3)")
    # rollouts of the TensorFlow model, full-frame and map-reduce over two workers
    for extra in ((), ("--mode", "mapreduce", "--workers", "2", "--tile", "32", "--halo", "8")):
        proc = run_in_process("infer", "--model-run", tf_out["run_id"], "--steps", "4", *extra, "--json", cwd=trainable)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "absl::InitializeLog" not in proc.stderr and "cuInit" not in proc.stderr  # TensorFlow's runtime notices stay out
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["steps"] == 4 and out["frames_per_s"] > 0 and len(out["errors"]["vorticity"]) == 4
        assert client().get_run(out["run_id"]).data.tags[Tag.FRAMEWORK] == "tensorflow"
        if extra:
            assert out["tiles"] == 3 and 0 <= out["seam_rel_error"] < 1


def test_mirrored_over_two_logical_cpus_and_multiworker_over_two_processes_complete(trainable):
    mirrored = train(trainable, *TF, *NET, "--world-size", "2", "--epochs", "2", "--batch-sizes", "4")
    assert (mirrored["strategy"], mirrored["world_size"]) == ("mirrored", 2)
    workers = train(trainable, *TF, *NET, "--strategy", "multiworker", "--world-size", "2", "--epochs", "2", "--batch-sizes", "4")
    assert (workers["strategy"], workers["world_size"]) == ("multiworker", 2)
    for out in (mirrored, workers):
        run = client().get_run(out["run_id"])
        assert run.info.status == "FINISHED" and np.isfinite(out["final_l1"])
        assert (run.data.params["strategy"], run.data.params["world_size"], run.data.params["per_device_batch"]) == (out["strategy"], "2", "2")
        assert sorted(m.step for m in client().get_metric_history(out["run_id"], "epoch_time_s")) == [1, 2]
    # one MLflow run for the two worker processes, its model written once
    assert (trainable / "data" / "runs" / workers["run_id"] / "model" / "generator.keras").is_file()


def test_a_tensorflow_run_stopped_and_killed_after_validated_epochs_resumes_to_the_uninterrupted_result(trained):
    trainable, _, whole = trained
    resumed = stopped_and_resumed(trainable, ("--dataset", "tiny", *TF, *WHOLE), 4, kill_after=3)
    assert client().get_run(resumed["run_id"]).info.status == "FINISHED"
    for a, b in zip(*keras_weights(trainable, whole["run_id"], resumed["run_id"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert_same_result(resumed["run_id"], whole["run_id"], rel=1e-5)


@pytest.mark.parametrize("args, fragments", [
    (("--strategy", "mirrored"), ("strategy mirrored is tensorflow's", "torch takes auto")),
    ((*TF, "--strategy", "tpu"), ("strategy tpu does not run on device cpu",)),
    ((*TF, "--strategy", "mirrored"), ("strategy mirrored on cpu needs --world-size 2 or more",)),
    ((*TF, "--precision", "bf16"), ("the tensorflow version trains in fp32 only",)),
    ((*TF, "--device", "xla"), ("strategy tpu needs a TPU host",)),
])
def test_bad_tensorflow_settings_are_refused_in_one_line(trainable, args, fragments):
    assert_refused(run_in_process("train", "--dataset", "tiny", *NET, *args, cwd=trainable), *fragments)
