"""Autoregressive rollout of a trained generator, full-frame or map-reduce tiled over workers, scored
against the reference solver; executed inside the child process (tasks.worker).

``plan_rollout`` reads only small things (the model's meta.json, the dataset's manifest) and checks
the request — channels, tiling, workers — so the CLI can refuse bad input before any work starts;
the child runs the same checks again before loading anything heavy.
"""

import json
import logging
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.device import resolve_device
from models.flow_metrics import RolloutScore, relative_l2
from models.inference import Predictor, StepTimes, cpu_cores, make_runner
from models.nets import NetConfig, build_generator
from models.tiling import TilePlan, TilingError
from tasks.data import INPUTS, OUTPUTS, StepCodec, load_frames
from tasks.errors import UserError
from tasks.scoring import roll, rollout_steps, step_time
from tasks.plots import error_curves, rollout_animation, vorticity_panels
from tasks.settings import Settings
from tasks.simulate import SimulationSpec
from tasks.specs import InferSpec
from tasks.store import load_manifest
from tasks.tracking import Run, client_for

log = logging.getLogger("karman.infer")
FIELDS = ("u", "v", "p", "vorticity")
PHASES = ("split", "transfer", "compute", "merge")


def _download(settings: Settings, model_run: str, path: str, tmp: str) -> Path:
    try:
        return Path(client_for(settings).download_artifacts(model_run, path, tmp))
    except Exception as exc:
        raise UserError(f"training run {model_run!r} has no {path} artifact ({type(exc).__name__})") from None


def model_meta(settings: Settings, model_run: str) -> dict:
    """The metadata of a training run's model (network, normaliser, channels, dataset, split)."""
    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(_download(settings, model_run, "model/meta.json", tmp).read_text())


def load_model(settings: Settings, model_run: str, device) -> tuple[torch.nn.Module, dict]:
    """Generator (eval mode) and its metadata from a training run's 'model' artifact."""
    with tempfile.TemporaryDirectory() as tmp:
        local = _download(settings, model_run, "model", tmp)
        meta = json.loads((local / "meta.json").read_text())
        state = torch.load(local / "generator.pt", map_location="cpu", weights_only=True)
    generator = build_generator(NetConfig(**meta["net"]))
    generator.load_state_dict(state)
    return generator.to(device).eval(), meta


@dataclass
class RolloutPlan:
    """What a rollout request resolves to, checked: the reference simulation and the tiling."""

    meta: dict
    dataset: str
    simulation: str
    sim_spec: SimulationSpec
    tiles: TilePlan  # the request's tiling (one tile, the whole frame, in full mode)
    full_frame: TilePlan | None  # the full-frame plan for the seam error, None if the U-Net can't take the frame

    @property
    def frame_stride(self) -> int:
        return int(self.meta["frame_stride"])

    @property
    def regime(self) -> dict:
        """Where the reference lies against the training data: a training simulation, interpolation
        (a Reynolds number inside the training range the model never saw) or extrapolation."""
        re, seen = float(self.sim_spec.reynolds), self.meta.get("train_reynolds")
        if not seen:
            return {"reynolds": re, "regime": "unknown"}
        lo, hi = min(seen), max(seen)
        if self.dataset == self.meta["dataset"] and self.simulation in self.meta["split"]["train"]:
            regime = "training simulation"
        elif lo <= re <= hi:
            regime = "interpolation"
        else:
            regime = "extrapolation"
        return {"reynolds": re, "train_reynolds_min": lo, "train_reynolds_max": hi, "regime": regime}


def plan_rollout(settings: Settings, spec: InferSpec, model_run_id: str, meta: dict | None = None) -> RolloutPlan:
    """Resolve and check a rollout request; UserError naming the value and what is allowed."""
    meta = meta or model_meta(settings, model_run_id)
    net = NetConfig(**meta["net"])
    dataset = spec.dataset or meta["dataset"]
    if net.in_channels != len(INPUTS) or net.out_channels != len(OUTPUTS) or list(meta.get("inputs", INPUTS)) != list(INPUTS):
        raise UserError(f"model run {model_run_id} maps {net.in_channels} channels ({', '.join(meta.get('inputs', []))}) to "
                        f"{net.out_channels}, but dataset {dataset!r} gives {len(INPUTS)} ({', '.join(INPUTS)}) -> "
                        f"{len(OUTPUTS)} ({', '.join(OUTPUTS)}); roll it out on data with the model's channels")
    manifest = load_manifest(settings.dataset_dir(dataset))
    sims = manifest["simulations"]
    if spec.simulation:
        simulation = spec.simulation
    elif dataset == meta["dataset"]:
        simulation = (meta["split"]["test"] or meta["split"]["train"])[0]
    else:
        simulation = sorted(sims)[0]
    if simulation not in sims:
        raise UserError(f"simulation {simulation!r} is not in dataset {dataset!r}; choose one of {', '.join(sorted(sims))}")
    sim_spec = SimulationSpec(**sims[simulation]["spec"])
    height, width = sim_spec.ny, sim_spec.nx
    unit = 2**net.generator_depth
    full_fits = height % unit == 0 and width % unit == 0
    if spec.mode == "full":
        if not full_fits:
            raise UserError(f"frame {height}x{width} of {simulation} does not fit the model's U-Net (depth {net.generator_depth}: "
                            f"sides must be multiples of {unit}); use --mode mapreduce with tiles of a multiple of {unit}")
        tiles = TilePlan(height, width, (height, width), 0, unit)
    else:
        tile = tuple(spec.tile) if spec.tile else (net.size, net.size)
        try:
            tiles = TilePlan(height, width, (tile[0], tile[-1]), spec.halo, unit)
        except TilingError as exc:
            raise UserError(f"tiling of the {height}x{width} frame of {simulation}: {exc}") from None
    if spec.device == "cpu" and spec.workers > cpu_cores():
        raise UserError(f"{spec.workers} workers requested but this host has {cpu_cores()} CPU cores; use at most {cpu_cores()}")
    steps = rollout_steps(sim_spec.frames, spec.start_frame, int(meta["frame_stride"]), spec.steps)
    if steps < 1:
        raise UserError(f"simulation {simulation} has {sim_spec.frames} frames: no rollout step fits after start frame "
                        f"{spec.start_frame} with frame stride {meta['frame_stride']}")
    full_frame = TilePlan(height, width, (height, width), 0, unit) if full_fits else None
    return RolloutPlan(meta, dataset, simulation, sim_spec, tiles, full_frame)


def check_workers(spec: InferSpec, probed: dict | None) -> None:
    """Workers against the devices a probe found (cuda, xla); UserError if there are not that many."""
    if spec.device == "cpu" or probed is None:
        return
    available = int(probed["world_size"])
    if spec.workers > available:
        raise UserError(f"{spec.workers} workers requested but {probed['device']} has {available} {spec.device} device(s); use at most {available}")
    if spec.device == "xla" and spec.workers not in (1, available):
        raise UserError(f"xla map-reduce shards each batch over all {available} devices; use --workers 1 or {available}")


def run_rollout(job: dict) -> dict:
    spec, settings = InferSpec(**job["spec"]), Settings(**job["settings"])
    run = Run(client_for(settings), job["run_id"])
    generator, meta = load_model(settings, job["model_run_id"], "cpu")
    setup = plan_rollout(settings, spec, job["model_run_id"], meta)  # the parent checked it; this resolves it
    ctx = resolve_device(spec.device, data_parallel=spec.device == "xla" and spec.workers > 1)
    try:
        predictor = Predictor(setup.tiles, make_runner(generator, ctx, spec.workers), spec.group)
        reference = (Predictor(setup.full_frame, make_runner(generator, ctx, 1))
                     if spec.mode == "mapreduce" and setup.full_frame is not None else None)
    except (ValueError, TilingError) as exc:
        raise UserError(str(exc)) from None
    try:
        return _rollout(spec, settings, run, setup, ctx, predictor, reference, job)
    finally:
        if reference is not None:
            reference.close()
        predictor.close()


def _rollout(spec: InferSpec, settings: Settings, run: Run, setup: RolloutPlan, ctx, predictor: Predictor,
             reference: Predictor | None, job: dict) -> dict:
    meta, sim, stride = setup.meta, setup.simulation, setup.frame_stride
    codec = StepCodec.from_meta(meta)
    norm = codec.norm
    frames = load_frames(settings.dataset_dir(setup.dataset), sim)  # (T, 4, H, W) physical u, v, p, mask
    steps = rollout_steps(len(frames), spec.start_frame, stride, spec.steps)
    plan = setup.tiles
    run.log_params({"rollout_simulation": sim, "rollout_steps": steps, "frame_stride": stride, "device_name": ctx.description,
                    "rollout_dataset": setup.dataset, "dataset_digest": meta["dataset_digest"], "model_run_id": job["model_run_id"],
                    "tile_shape": f"{plan.tile[0]}x{plan.tile[1]}", "tiles": plan.count, "tile_overhead": round(plan.overhead, 4),
                    "group_size": predictor.group, "frame": f"{plan.height}x{plan.width}", **setup.regime})

    score = RolloutScore(step_time(setup.sim_spec, stride), spec.threshold_u, spec.threshold_vorticity)
    seams: list[float] = []
    latencies: list[float] = []
    phases: list[StepTimes] = []
    w_preds, w_refs = [], []

    def predict(state: np.ndarray, cond: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        out, times = predictor(cond)  # (3, H, W) network units
        latencies.append(time.perf_counter() - t0)
        phases.append(times)
        pred = codec.next_state(state, out)  # (3, H, W) physical
        if reference is not None:  # seam error: map-reduce against full-frame on the same input (not timed)
            full = codec.next_state(state, reference(cond)[0])
            seams.append(max(relative_l2(pred[c], full[c]) for c in range(len(OUTPUTS))))
        return pred

    for step in roll(predict, codec, frames, setup.sim_spec, stride, steps, score, spec.start_frame):
        metrics = step.metrics | {"step_latency_s": latencies[-1]} | {f"{name}_s": getattr(phases[-1], name) for name in PHASES}
        if seams:
            metrics["step_seam_rel_error"] = seams[-1]
        run.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step.n)
        w_preds.append(step.w_pred)
        w_refs.append(step.w_ref)

    warm = statistics.median(latencies[1:]) if steps > 1 else latencies[0]
    warm_phases = phases[1:] or phases
    errors = score.errors
    from tasks.bench import time_solver

    solver_s, solver_name = time_solver(setup.sim_spec.flow_config(), stride * setup.sim_spec.frame_every, spec.device, spec.workers)
    quality = score.summary()
    summary = {
        "frames_per_s": 1.0 / warm, "cold_step_s": latencies[0], "warm_step_s": warm,
        "compile_s": max(latencies[0] - warm, 0.0),
        **{f"latency_{name}_s": statistics.median(getattr(t, name) for t in warm_phases) for name in PHASES},
        **quality,
        "solver_frames_per_s": 1.0 / solver_s, "surrogate_vs_solver": solver_s / warm,
        "crossover_stride": float(np.ceil(warm / (solver_s / stride))),
        # cost of one convective time unit D/U of simulated flow
        "surrogate_s_per_time_unit": warm / score.dt, "solver_s_per_time_unit": solver_s / score.dt,
    }
    if seams:
        summary |= {"seam_rel_error": max(seams), "seam_rel_error_first": seams[0]}
    run.log_metrics({k: v for k, v in summary.items() if math.isfinite(v)})  # NaN (no frequency found) is left out
    verdict = surrogate_verdict(summary, score.dt, spec.threshold_vorticity, stride, setup.sim_spec)
    run.log_params({"solver_compared": solver_name, "verdict": verdict[:500]})

    out_dir = settings.run_dir(job["run_id"])
    out_dir.mkdir(parents=True, exist_ok=True)
    show = sorted({0, max(0, steps // 2 - 1), steps - 1})
    run.log_artifact(vorticity_panels(np.stack([w_preds[i] for i in show]), np.stack([w_refs[i] for i in show]),
                                      [f"step {i + 1}" for i in show], out_dir / "vorticity_rollout.png",
                                      f"rollout on {sim}: predicted vs reference vorticity"))
    run.log_artifact(error_curves(errors, spec.threshold_vorticity, out_dir / "rollout_error.png", f"rollout error on {sim}"))
    run.log_artifact(rollout_animation(np.stack(w_preds), np.stack(w_refs), out_dir / "rollout.gif",
                                       f"{spec.mode} x{spec.workers} on {sim}"))
    log.info("%s rollout of %d steps on %s (%d tiles, %d workers): %.2f frames/s warm, solver %.2f frames/s, "
             "final vorticity error %.3f", spec.mode, steps, sim, plan.count, spec.workers, summary["frames_per_s"],
             summary["solver_frames_per_s"], errors["vorticity"][-1])
    log.info("verdict: %s", verdict)
    return {**summary, "verdict": verdict, "simulation": sim, "steps": steps, "mode": spec.mode, "workers": spec.workers,
            "tiles": plan.count, "tile": list(plan.tile), "errors": errors, "seam_errors": seams,
            "vorticity_correlation": score.correlation, "energy_ratio": score.energy_ratio, **setup.regime}


def surrogate_verdict(summary: dict, dt: float, threshold: float, stride: int, sim: SimulationSpec) -> str:
    """One sentence: which is faster per unit of simulated time at this resolution, and the accuracy the
    surrogate holds while it is (the vorticity horizon)."""
    ratio = summary["solver_s_per_time_unit"] / summary["surrogate_s_per_time_unit"]
    faster = f"the surrogate is {ratio:.2g}x faster than the solver" if ratio >= 1 else f"the solver is {1 / ratio:.2g}x faster than the surrogate"
    horizon = int(summary["horizon_vorticity"])
    periods = horizon * dt * summary["strouhal_ref"] if summary["strouhal_ref"] == summary["strouhal_ref"] else float("nan")
    return (f"At {sim.ny}x{sim.nx} and stride k={stride} ({stride * sim.frame_every} solver steps per network step), {faster} "
            f"per unit of simulated time, at an accuracy of vorticity relative L2 <= {threshold:g} for {horizon} steps "
            f"({horizon * dt:.3g} D/U, {periods:.2g} shedding periods); the surrogate would break even at k >= "
            f"{summary['crossover_stride']:.0f}.")
