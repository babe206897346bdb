"""The scored rollout of a RolloutPlan, whatever the framework (child process, no framework imported): the Predictor steps, metrics, figures, solver comparison and verdict.

The torch job (torch.py), the TensorFlow job (tensorflow.py) and the JAX job (jax.py) each build a Predictor for their network and hand it here.
"""

import logging
import math
import statistics
import time

import numpy as np

from models.karman.flow_metrics import RolloutScore, relative_l2
from models.karman.inference import Predictor, StepTimes
from models.karman.tiling import TilingError
from tasks.common.config.errors import UserError
from tasks.common.reports.plots import error_curves, rollout_animation, vorticity_panels
from tasks.common.records import RECORD_FILE, RolloutConfig, RolloutRecord, RolloutSummary
from tasks.common.config.settings import Settings
from tasks.common.specs import InferSpec
from tasks.common.tracking.runs import Run
from tasks.workloads.karman.infer.plan import RolloutPlan
from tasks.workloads.karman.data import OUTPUTS, StepCodec, load_frames, with_condition
from tasks.workloads.karman.scoring import roll, rollout_steps, step_time
from tasks.workloads.karman.simulation import SimulationSpec

log = logging.getLogger("karman.infer")
PHASES = ("split", "transfer", "compute", "merge")


def run_scored(spec: InferSpec, settings: Settings, run: Run, setup: RolloutPlan, device_name: str, predictor: Predictor,
               reference: Predictor | None, job: dict) -> dict:
    """Roll the plan's model out with ``predictor`` (and ``reference``, the full frame, for the seam error of map-reduce), score it, log it and say what it found."""
    meta, sim, stride = setup.meta, setup.simulation, setup.frame_stride
    codec = StepCodec.from_meta(meta)
    norm = codec.norm
    conditioned = "reynolds" in meta.get("inputs", ())
    # (T, 4, H, W) physical u, v, p, mask, and the simulation's Reynolds number for a model conditioned on it
    frames = with_condition(load_frames(settings.dataset_dir(setup.dataset), sim), setup.sim_spec.reynolds if conditioned else None)
    steps = rollout_steps(len(frames), spec.start_frame, stride, spec.steps)
    plan = setup.tiles
    run.log_params({"rollout_simulation": sim, "rollout_steps": steps, "frame_stride": stride, "device_name": device_name, "inflow_held": spec.hold_inflow or codec.constrain,
                    "rollout_dataset": setup.dataset, "dataset_digest": meta["dataset_digest"], "model_run_id": setup.model_run_id,
                    "tile_shape": f"{plan.tile[0]}x{plan.tile[1]}", "tiles": plan.count, "tile_overhead": round(plan.overhead, 4),
                    "group_size": predictor.group, "frame": f"{plan.height}x{plan.width}", **setup.regime})
    record = RolloutRecord(config=RolloutConfig(
        framework=setup.framework, model_run=setup.model_run_id, spec=spec, device_name=device_name, dataset=setup.dataset,
        simulation=sim, steps=steps, frame_stride=stride, tile=tuple(plan.tile), tiles=plan.count, regime=setup.regime))
    run.log_dict(record.model_dump(mode="json"), RECORD_FILE)

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

    for step in roll(predict, codec, frames, setup.sim_spec, stride, steps, score, spec.start_frame, spec.hold_inflow):
        metrics = step.metrics | {"step_latency_s": latencies[-1]} | {f"{name}_s": getattr(phases[-1], name) for name in PHASES}
        if seams:
            metrics["step_seam_rel_error"] = seams[-1]
        run.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step.n)
        w_preds.append(step.w_pred)
        w_refs.append(step.w_ref)

    warm = statistics.median(latencies[1:]) if steps > 1 else latencies[0]
    warm_phases = phases[1:] or phases
    errors = score.errors
    from models.karman.solver.timing import time_solver

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
    record = record.model_copy(update={"summary": RolloutSummary(scores={k: v if math.isfinite(v) else None for k, v in summary.items()},
                                                                 verdict=verdict, solver=solver_name)})
    run.log_dict(record.model_dump(mode="json"), RECORD_FILE)

    out_dir = settings.run_dir(job["run_id"])
    out_dir.mkdir(parents=True, exist_ok=True)
    show = sorted({0, max(0, steps // 2 - 1), steps - 1})
    run.log_artifact(vorticity_panels(np.stack([w_preds[i] for i in show]), np.stack([w_refs[i] for i in show]),
                                      [f"step {i + 1}" for i in show], out_dir / "vorticity_rollout.png",
                                      f"rollout on {sim}: predicted vs reference vorticity"))
    curves = errors | {"vorticity lag-aligned": score.lagged, "vorticity low-passed": score.lowpass}
    run.log_artifact(error_curves(curves, spec.threshold_vorticity, out_dir / "rollout_error.png", f"rollout error on {sim}"))
    run.log_artifact(rollout_animation(np.stack(w_preds), np.stack(w_refs), out_dir / "rollout.gif",
                                       f"{spec.mode} x{spec.workers} on {sim}"))
    log.info("%s rollout of %d steps on %s (%d tiles, %d workers): %.2f frames/s warm, solver %.2f frames/s, "
             "final vorticity error %.3f", spec.mode, steps, sim, plan.count, spec.workers, summary["frames_per_s"],
             summary["solver_frames_per_s"], errors["vorticity"][-1])
    log.info("verdict: %s", verdict)
    return {**summary, "verdict": verdict, "simulation": sim, "steps": steps, "mode": spec.mode, "workers": spec.workers,
            "tiles": plan.count, "tile": list(plan.tile), "errors": errors, "seam_errors": seams,
            "vorticity_correlation": score.correlation, "energy_ratio": score.energy_ratio, "vorticity_lagged": score.lagged,
            "lag_steps": score.lags, "vorticity_lowpass": score.lowpass, "band_errors": [b.tolist() for b in score.bands], **setup.regime}


def surrogate_verdict(summary: dict, dt: float, threshold: float, stride: int, sim: SimulationSpec) -> str:
    """One sentence: which is faster per unit of simulated time at this resolution, and the accuracy the
    surrogate holds while it is (the vorticity horizon)."""
    ratio = summary["solver_s_per_time_unit"] / summary["surrogate_s_per_time_unit"]
    faster = f"the surrogate is {ratio:.2g}x faster than the solver" if ratio >= 1 else f"the solver is {1 / ratio:.2g}x faster than the surrogate"
    horizon = int(summary["horizon_vorticity"])
    st_ref = summary.get("strouhal_ref", float("nan"))
    periods = f"{horizon * dt * st_ref:.2g} shedding periods" if st_ref == st_ref else "the rollout too short to measure the shedding period"
    return (f"At {sim.ny}x{sim.nx} and stride k={stride} ({stride * sim.frame_every} solver steps per network step), {faster} "
            f"per unit of simulated time, at an accuracy of vorticity relative L2 <= {threshold:g} for {horizon} steps "
            f"({horizon * dt:.3g} D/U, {periods}); the surrogate would break even at k >= "
            f"{summary['crossover_stride']:.0f}.")


def roll_out(spec: InferSpec, settings: Settings, run: Run, setup: RolloutPlan, device_name: str, runner_for, job: dict) -> dict:
    """The plan's model rolled out by the runners ``runner_for(workers)`` makes (the tiles on the spec's workers; for
    map-reduce, the full frame on one as well, for the seam error), scored and logged (run_scored); UserError for tiles that
    cannot be made; the predictors closed whatever happens."""
    try:
        predictor = Predictor(setup.tiles, runner_for(spec.workers), spec.group)
        reference = Predictor(setup.full_frame, runner_for(1)) if spec.mode == "mapreduce" and setup.full_frame is not None else None
    except (ValueError, TilingError) as exc:
        raise UserError(str(exc)) from None
    try:
        return run_scored(spec, settings, run, setup, device_name, predictor, reference, job)
    finally:
        if reference is not None:
            reference.close()
        predictor.close()
