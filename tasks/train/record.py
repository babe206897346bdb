"""What every training job records, whatever its framework (child process, no framework imported): run parameters, step metrics, epoch lines, sample figure and summary under one set of names.

The torch job (job.py) and the TensorFlow job (job_keras.py) both report through these helpers, so a
TensorFlow cell's MLflow run has the same parameter and metric names as a torch cell's.
"""

import dataclasses
import json
import logging
import math
import os
import resource
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from models.solver import vorticity
from tasks.common.data import IN_MEMORY_BYTES, Normalizer, PairSource, StepCodec, split_of, training_net
from tasks.common.errors import RunFailed, RunStopped, signal_name
from tasks.common.plots import vorticity_panels
from tasks.common.progress import time_left
from tasks.common.store import load_manifest
from tasks.common.tracking import Run, code_version

METRIC_FLUSH = 50  # per-step metrics go to MLflow in batches of this many steps
PROGRESS_EVERY_S = float(os.environ.get("KARMAN_PROGRESS_EVERY_S", "10"))  # within an epoch, a progress line at most this often
WARMUP_STEPS = 2  # steps of each process timed apart: tracing, compilation, allocator and cache warm-up


def training_data(settings, spec):
    """What a training run trains on, the same in every framework: (dataset folder, manifest, split,
    recipe, training pairs, codec, network shapes). Training sets that fit are decoded once and held in
    memory; the normalisation is fitted by streaming over the training frames."""
    dataset_dir = settings.dataset_dir(spec.dataset)
    manifest = load_manifest(dataset_dir)
    split = split_of(manifest, spec.val_simulations, spec.test_simulations, spec.seed)
    recipe = spec.resolved_recipe()
    train = PairSource(dataset_dir, split["train"], spec.frame_stride, unroll=recipe.unroll)
    if train.nbytes <= IN_MEMORY_BYTES:  # decoded once, not per batch on the cores that train
        train.hold_in_memory()
    norm = Normalizer.fit(train)
    codec = StepCodec(norm, train.change_rms().tolist() if recipe.predict == "delta" else None)
    net = training_net(train.height, train.width, spec.crop, spec.depth, ngf=recipe.ngf, ndf=recipe.ndf, norm=spec.norm,
                       dropout=recipe.dropout, upsample=recipe.upsample, output=recipe.output)
    return dataset_dir, manifest, split, recipe, train, codec, net


class StepLog:
    """Per-step metrics, sent to MLflow in batches (rank 0 only)."""

    def __init__(self, run: Run | None):
        self.run, self.pending = run, []

    def add(self, step: int, values: dict[str, float]) -> None:
        if self.run is not None:
            self.pending.append((step, values))
            if len(self.pending) >= METRIC_FLUSH:
                self.flush()

    def flush(self) -> None:
        if self.run is not None and self.pending:
            self.run.log_step_metrics(self.pending)
        self.pending = []


def check_finite(values: dict[str, float], epoch: int, global_step: int, checkpoint: Path, steps: StepLog) -> None:
    """RunFailed naming the step and the losses if any loss is not finite (the step metrics so far are sent first)."""
    if all(math.isfinite(v) for v in values.values()):
        return
    steps.flush()
    kept = f"the last good checkpoint (epoch {epoch - 1}) is kept at {checkpoint}" if checkpoint.exists() else "no checkpoint was written yet"
    raise RunFailed(f"loss became non-finite at epoch {epoch}, step {global_step} "
                    f"({', '.join(f'{k}={v:.4g}' for k, v in values.items())}); {kept}")


def stopped(signalled: int | None, epoch: int, global_step: int, checkpoint: Path, run_id: str, steps: StepLog) -> RunStopped:
    """The error a run stopped by a signal ends with: where it stopped, what is kept, how to go on."""
    steps.flush()
    kept = f"the checkpoint of epoch {epoch - 1} is kept" if checkpoint.exists() else "no checkpoint was written yet"
    again = f"resume with python -m flows train --resume {run_id}" if checkpoint.exists() else "start it afresh"
    return RunStopped(f"stopped by {signal_name(signalled or signal.SIGTERM)} at epoch {epoch}, step {global_step}; {kept}; {again}")


def validate(score: Callable[[], dict[str, float]], validation, spec, epoch: int, history: dict, train_s: float, metrics: dict,
             log: logging.Logger) -> float:
    """Score the validation rollouts (``score()``), add them to the epoch's ``metrics`` and, the first
    time the target holds, the time to target to ``history``; 1.0 if training should stop at it."""
    quality = score()
    history["train_s"] = train_s  # validation counts as training time
    metrics |= {f"val_{k}": v for k, v in quality.items() if math.isfinite(v)} | {"train_time_s": train_s}
    if not validation.reached(quality) or "target" in history:
        return 0.0
    samples = history.get("samples", 0)
    history["target"] = {"time_to_target_s": train_s, "epochs_to_target": epoch, "samples_to_target": samples}
    metrics |= history["target"]
    log.info("quality target reached after %.1f s, epoch %d, %d samples: vorticity within %.3g for %d steps",
             train_s, epoch, samples, spec.target_vorticity, spec.target_steps)
    return float(spec.stop_at_target)


class StepProgress:
    """Progress within an epoch: 'epoch E: step S/N; P% done, about T left' at most every PROGRESS_EVERY_S
    (rank 0), so that a long epoch is not silent; the flow's progress artifact reads its '% done'."""

    def __init__(self, log: logging.Logger, enabled: bool, every_s: float = PROGRESS_EVERY_S):
        self.log, self.enabled, self.every_s, self.last = log, enabled, every_s, time.monotonic()

    def restart(self) -> None:
        """The epoch's own line was just logged: the next progress line comes a whole interval later."""
        self.last = time.monotonic()

    def step(self, epoch: int, step: int, steps: int, fraction: float, train_s: float) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < self.every_s or step == steps:  # the epoch's own line follows the last step
            return
        self.last = now
        left = time_left(train_s, fraction)
        self.log.info("epoch %d: step %d/%d; %.0f%% done%s", epoch, step, steps, 100 * fraction, f", {left}" if left else "")


def host_peak_memory_mb() -> float:
    """This process's peak resident memory (KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_params(*, framework: str, version: str, device_name: str, world_size: int, strategy: str, batch_size: int, train: PairSource,
               net, g_params: int, d_params: int, manifest: dict, split: dict, speed: dict, recipe) -> dict:
    """The parameters a training run logs once, named alike for every framework."""
    return {
        "framework": framework, "framework_version": version, f"{framework}_version": version, "device_name": device_name,
        "world_size": world_size, "strategy": strategy, "batch_size": batch_size, "per_device_batch": batch_size // world_size,
        "image_height": train.height, "image_width": train.width, "generator_depth": net.generator_depth,
        "generator_params": g_params, "discriminator_params": d_params, "dataset_digest": manifest["digest"],
        "train_pairs": len(train), "split": json.dumps(split), "code_version": code_version(),
        "speed": json.dumps(speed), "host": socket.gethostname(), "recipe_label": recipe.name, "data_in_memory": train.in_memory,
        **{f"recipe_{k}": v for k, v in dataclasses.asdict(recipe).items() if k != "name"},
    }


def log_epoch(log: logging.Logger, epoch: int, metrics: dict, last: dict, done_fraction: float, train_s: float) -> None:
    """The epoch's line (the flow's progress artifact reads its '% done')."""
    left = time_left(train_s, done_fraction)
    log.info("epoch %d: %.1f s, %.2f samples/s, L1 %.4f, D %.3f, data wait %.1f%%%s; %.0f%% done%s", epoch, metrics["epoch_time_s"],
             metrics["epoch_samples_per_s"], last["loss_l1"], last["loss_d"], 100 * metrics["data_wait_fraction"],
             f", validation: vorticity horizon {metrics['val_horizon_vorticity']:.0f} steps" if "val_horizon_vorticity" in metrics else "",
             100 * done_fraction, f", {left}" if left else "")


def summary(history: dict, global_step: int, last: dict, samples_per_epoch: int) -> dict:
    """The finished run's summary metrics (the same names for every framework)."""
    epochs = history["epoch_s"]
    steady = epochs[1:] or epochs  # the first epoch carries the warm-up
    time_per_epoch = float(np.median(steady))
    return {
        "epochs": len(epochs), "steps": global_step, "warmup_s": float(np.nansum(history["warmup_s"])),
        "time_per_epoch_s": time_per_epoch, "samples_per_s": samples_per_epoch / time_per_epoch,
        "final_l1": last.get("loss_l1", float("nan")),
        "train_time_s": history.get("train_s", float(np.sum(epochs))), "samples_seen": history.get("samples", 0),
        "target_reached": float("target" in history), **history.get("target", {}),
    }


def largest_corner(x: np.ndarray, unit: int) -> np.ndarray:
    """The largest top-left corner of (..., H, W) whose sides are multiples of ``unit`` (what a U-Net
    trained on crops takes)."""
    return x[..., : x.shape[-2] - x.shape[-2] % unit, : x.shape[-1] - x.shape[-1] % unit]


def sample_figure(forward: Callable[[np.ndarray], np.ndarray], source: PairSource, codec: StepCodec, path: Path, unit: int) -> Path:
    """Vorticity of one-step predictions against targets for three training pairs; ``forward`` maps
    encoded states (B, 4, H, W) to the network's outputs (B, 3, H, W) (any framework, on the CPU)."""
    picks = np.linspace(0, len(source) - 1, 3).astype(int)
    cond, ref = source.physical(picks)  # (3, 4, H, W), (3, 3, H, W)
    # A model trained on crops may not take whole frames: show the largest corner it takes.
    cond, ref = largest_corner(cond, unit), largest_corner(ref[:, :3], unit)  # the first step's target
    pred = codec.next_state(cond, forward(codec.norm.encode(cond)))  # (3, 3, H, W)
    mask = cond[:, 3] > 0.5
    w_pred = vorticity(pred[:, 0], pred[:, 1], mask)
    w_ref = vorticity(ref[:, 0], ref[:, 1], mask)
    return vorticity_panels(w_pred, w_ref, [f"pair {j}" for j in picks], path, "one-step predictions (training pairs)")


def model_meta(net, codec: StepCodec, spec, manifest: dict, split: dict, framework: str, weights: Path) -> dict:
    """meta.json of a trained model: what a rollout needs besides the weights, and the weights file's name, size and checksum."""
    from tasks.common.data import INPUTS, OUTPUTS
    from tasks.common.store import file_sha256

    return {"net": dataclasses.asdict(net), "normalizer": dataclasses.asdict(codec.norm), "inputs": INPUTS, "outputs": OUTPUTS,
            "predict": "delta" if codec.delta_scale is not None else "state", "delta_scale": codec.delta_scale,
            "recipe": spec.resolved_recipe().name, "frame_stride": spec.frame_stride, "dataset": spec.dataset, "dataset_digest": manifest["digest"],
            "split": split, "framework": framework, "weights_file": weights.name,
            "train_reynolds": sorted(float(manifest["simulations"][s]["spec"]["reynolds"]) for s in split["train"]),
            # what a rollout checks before it uses the weights: their size (before any work) and checksum (on loading)
            "generator_bytes": weights.stat().st_size, "generator_sha256": file_sha256(weights)}
