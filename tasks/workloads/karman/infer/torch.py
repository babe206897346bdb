"""The rollout job (child process): a RolloutPlan carried out, full-frame or map-reduce tiled over workers, and scored against the reference solver."""

import tempfile

import torch

from models.device import resolve_device
from models.karman.inference import make_runner
from models.karman.nets.config import NetConfig
from models.karman.nets.pix2pix import build_generator
from tasks.common.config.settings import Settings
from tasks.common.tracking.runs import Run, client_for
from tasks.common.stores.model_files import checked_weights
from tasks.workloads.karman.infer.plan import RolloutPlan
from tasks.workloads.karman.infer.rollout import roll_out


def load_model(settings: Settings, model_run: str, device) -> tuple[torch.nn.Module, dict]:
    """Generator (eval mode) and its metadata from a training run's 'model' artifact."""
    with tempfile.TemporaryDirectory() as tmp:
        path, meta = checked_weights(settings, model_run, tmp)
        state = torch.load(path, map_location="cpu", weights_only=True)
    generator = build_generator(NetConfig(**meta["net"]))
    generator.load_state_dict(state)
    return generator.to(device).eval(), meta


def run_rollout(job: dict) -> dict:
    """The rollout job: the plan the parent made (``job['plan']``), carried out and scored."""
    setup, settings = RolloutPlan.from_json(job["plan"]), Settings(**job["settings"])
    spec = setup.spec
    run = Run(client_for(settings), job["run_id"])
    generator, _ = load_model(settings, setup.model_run_id, "cpu")
    ctx = resolve_device(spec.device, data_parallel=spec.device == "xla" and spec.workers > 1)
    return roll_out(spec, settings, run, setup, ctx.description, lambda workers: make_runner(generator, ctx, workers), job)


