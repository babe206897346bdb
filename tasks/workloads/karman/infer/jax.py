"""The JAX rollout job (child process): a JAX generator rolled out full-frame or map-reduce tiled over workers, scored as the torch job scores (tasks.workloads.karman.infer.rollout)."""

import os
import tempfile

from models.karman.nets.config import NetConfig
from tasks.common.config.errors import UserError
from tasks.common.config.settings import Settings
from tasks.common.tracking.runs import Run, client_for
from tasks.common.stores.model_files import checked_weights
from tasks.workloads.karman.infer.plan import RolloutPlan
from tasks.workloads.karman.infer.rollout import roll_out


def load_model(settings: Settings, model_run: str) -> tuple[NetConfig, dict, dict, dict]:
    """The generator's config, params and running statistics (torch's state dict names), and its metadata, from a
    training run's 'model' artifact."""
    from tasks.workloads.karman.jax import load_generator

    with tempfile.TemporaryDirectory() as tmp:
        path, meta = checked_weights(settings, model_run, tmp)
        params, stats = load_generator(path)
    return NetConfig(**meta["net"]), params, stats, meta


def run_rollout(job: dict) -> dict:
    """The rollout job: the plan the parent made (``job['plan']``), carried out and scored."""
    import jax

    setup, settings = RolloutPlan.from_json(job["plan"]), Settings(**job["settings"])
    spec = setup.spec
    if spec.device not in ("cpu", "cuda"):
        raise UserError(f"device {spec.device}: jax rollouts run on cpu or cuda (TPU rollouts are torch_xla's)")
    from models.karman.inference_jax import JaxRunner

    run = Run(client_for(settings), job["run_id"])
    cfg, params, stats, _ = load_model(settings, setup.model_run_id)
    name = f"cpu ({os.cpu_count()} cores, jax {jax.__version__})" if spec.device == "cpu" else f"GPU (jax {jax.__version__})"
    return roll_out(spec, settings, run, setup, name, lambda workers: JaxRunner(cfg, params, stats, spec.device, workers), job)
