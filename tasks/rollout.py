"""Autoregressive rollout of a trained generator, executed inside the child process (tasks.worker)."""

import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from models.device import resolve_device
from models.nets import NetConfig, build_generator
from models.solver import vorticity
from tasks.data import Normalizer, load_frames
from tasks.errors import UserError
from tasks.plots import error_curves, vorticity_panels
from tasks.settings import Settings
from tasks.specs import InferSpec
from tasks.tracking import Run, client_for

log = logging.getLogger("karman.infer")
FIELDS = ("u", "v", "p", "vorticity")


def relative_l2(pred: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(pred - ref) / max(np.linalg.norm(ref), 1e-12))


def load_model(settings: Settings, model_run: str, device) -> tuple[torch.nn.Module, dict]:
    """Generator (eval mode) and its metadata from a training run's 'model' artifact."""
    client = client_for(settings)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = Path(client.download_artifacts(model_run, "model", tmp))
        except Exception as exc:
            raise UserError(f"training run {model_run!r} has no model artifact ({type(exc).__name__})") from None
        meta = json.loads((local / "meta.json").read_text())
        state = torch.load(local / "generator.pt", map_location="cpu", weights_only=True)
    generator = build_generator(NetConfig(**meta["net"]))
    generator.load_state_dict(state)
    return generator.to(device).eval(), meta


def run_rollout(job: dict) -> dict:
    spec, settings = InferSpec(**job["spec"]), Settings(**job["settings"])
    run = Run(client_for(settings), job["run_id"])
    if spec.threads:
        torch.set_num_threads(spec.threads)
    ctx = resolve_device(spec.device)
    generator, meta = load_model(settings, job["model_run_id"], ctx.device)
    norm = Normalizer(**meta["normalizer"])
    stride = meta["frame_stride"]
    sim = spec.simulation or (meta["split"]["test"] or meta["split"]["train"])[0]
    frames = load_frames(settings.dataset_dir(meta["dataset"]), sim)  # (T, 4, H, W)
    steps = min(spec.steps, (len(frames) - 1 - spec.start_frame) // stride)
    if steps < 1:
        raise UserError(f"simulation {sim} has {len(frames)} frames: no rollout step fits after start frame {spec.start_frame} with stride {stride}")
    mask = frames[0, 3] > 0.5
    run.log_params({"rollout_simulation": sim, "rollout_steps": steps, "frame_stride": stride, "device_name": ctx.description,
                    "dataset": meta["dataset"], "dataset_digest": meta["dataset_digest"], "model_run_id": job["model_run_id"]})

    state = frames[spec.start_frame].copy()  # (4, H, W) physical u, v, p, mask
    errors = {name: [] for name in FIELDS}
    keep_pred, keep_ref, keep_labels = [], [], []
    show = sorted({1, max(1, steps // 2), steps})
    compute_s, cold_s = 0.0, None
    for n in range(1, steps + 1):
        cond = torch.from_numpy(norm.encode(state[None])).to(ctx.device)  # (1, 4, H, W)
        t0 = time.perf_counter()
        with torch.no_grad(), ctx.autocast():
            out = generator(cond)
        out = out.float().cpu().numpy()
        ctx.sync()
        dt = time.perf_counter() - t0
        cold_s = dt if cold_s is None else cold_s
        compute_s += dt if n > 1 else 0.0
        pred = norm.decode(out[0])  # (3, H, W)
        pred[:, mask] = 0.0
        state = np.concatenate([pred, frames[0, 3:4]])
        ref = frames[spec.start_frame + n * stride]
        w_pred, w_ref = vorticity(pred[0], pred[1], mask), vorticity(ref[0], ref[1], mask)
        step_err = {"u": relative_l2(pred[0], ref[0]), "v": relative_l2(pred[1], ref[1]),
                    "p": relative_l2(pred[2], ref[2]), "vorticity": relative_l2(w_pred, w_ref)}
        for k, v in step_err.items():
            errors[k].append(v)
        run.log_metrics({f"rel_l2_{k}": v for k, v in step_err.items()}, step=n)
        if n in show:
            keep_pred.append(w_pred)
            keep_ref.append(w_ref)
            keep_labels.append(f"step {n}")
    warm = compute_s / max(steps - 1, 1)
    horizon = next((i + 1 for i, e in enumerate(errors["vorticity"]) if e > spec.error_threshold), None)
    out_dir = settings.run_dir(job["run_id"])
    out_dir.mkdir(parents=True, exist_ok=True)
    run.log_artifact(vorticity_panels(np.stack(keep_pred), np.stack(keep_ref), keep_labels, out_dir / "vorticity_rollout.png",
                                      f"rollout on {sim}: predicted vs reference vorticity"))
    run.log_artifact(error_curves(errors, spec.error_threshold, out_dir / "rollout_error.png", f"rollout error on {sim}"))
    summary = {
        "frames_per_s": 1.0 / warm if warm > 0 else float("inf"), "cold_step_s": cold_s, "warm_step_s": warm,
        "final_rel_l2_u": errors["u"][-1], "final_rel_l2_vorticity": errors["vorticity"][-1],
        "mean_rel_l2_u": float(np.mean(errors["u"])), "steps_below_threshold": horizon - 1 if horizon else steps,
    }
    run.log_metrics(summary)
    log.info("rollout of %d steps on %s: %.1f frames/s warm, final vorticity error %.3f", steps, sim,
             summary["frames_per_s"], errors["vorticity"][-1])
    return {**summary, "simulation": sim, "steps": steps, "errors": errors}
