"""The TensorFlow rollout job (child process): a Keras generator rolled out full-frame or map-reduce tiled over workers, scored as the torch job scores (tasks.workloads.karman.infer.rollout)."""

import os
import tempfile

from models.host import cpu_cores
from tasks.common.config.errors import UserError
from tasks.common.config.settings import Settings
from tasks.common.tracking.runs import Run, client_for
from tasks.common.stores.model_files import checked_weights
from tasks.workloads.karman.infer.plan import RolloutPlan
from tasks.workloads.karman.infer.rollout import roll_out


def load_model(settings: Settings, model_run: str):
    """The Keras generator and its metadata from a training run's 'model' artifact."""
    import keras

    with tempfile.TemporaryDirectory() as tmp:
        path, meta = checked_weights(settings, model_run, tmp)
        return keras.saving.load_model(path, compile=False), meta


def run_rollout(job: dict) -> dict:
    """The rollout job: the plan the parent made (``job['plan']``), carried out and scored."""
    import tensorflow as tf

    setup, settings = RolloutPlan.from_json(job["plan"]), Settings(**job["settings"])
    spec = setup.spec
    if spec.device not in ("cpu", "cuda"):
        raise UserError(f"device {spec.device}: tensorflow rollouts run on cpu or cuda (TPU rollouts are torch_xla's)")
    if spec.device == "cpu":  # the workers are the parallelism: each call runs on its share of the cores
        tf.config.threading.set_intra_op_parallelism_threads(max(1, cpu_cores() // spec.workers))
        tf.config.threading.set_inter_op_parallelism_threads(spec.workers)
    from models.karman.inference_keras import KerasRunner

    run = Run(client_for(settings), job["run_id"])
    generator, _ = load_model(settings, setup.model_run_id)
    name = f"cpu ({os.cpu_count()} cores, tensorflow {tf.__version__})" if spec.device == "cpu" else f"GPU (tensorflow {tf.__version__})"
    return roll_out(spec, settings, run, setup, name, lambda workers: KerasRunner(generator, spec.device, workers), job)
