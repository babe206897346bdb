"""karman's part of bench-quality: each seed's generator scored on its rollouts, its step timed against the solver's.

The test simulation's rollout and every simulation of the extra datasets are scored; the network's step is timed
against the solver's on the same device; the seeds are summarised."""

import math
import statistics
import time

import numpy as np
import torch

from tasks.common.specs import TrainSpec
from tasks.common.stores.store import load_manifest
from tasks.workloads.karman.data import StepCodec
from tasks.workloads.karman.scoring import load_simulation, score_generator

# Rollout scores reported for the test simulation and each extra one.
TEST_SCORES = ("one_step_rel_l2_u", "one_step_rel_l2_vorticity", "one_step_skill_u", "one_step_skill_vorticity",
               "horizon_u", "horizon_vorticity", "strouhal_pred", "strouhal_ref", "strouhal_rel_error", "correlation_periods",
               "energy_ratio_final", "energy_ratio_max_deviation", "stable_steps", "finite", "shedding_amplitude_ratio",
               "horizon_vorticity_lagged", "final_lag_steps", "horizon_vorticity_lowpass", "frequency_rel_error_phase", "phase_lag_final",
               "correlation_steps", "correlation_time", "band_error_low_final", "band_error_mid_final", "band_error_high_final",
               "acdm_mse_60", "acdm_mse_60_inc_units", "mgn_rmse_1", "mgn_rmse_50", "mgn_rmse_600")


def bench_quality(settings, bench, spec: TrainSpec, runtime, train, folders: list) -> dict:
    """bench-quality of a karman recipe: ``train(spec)`` (the stage's: data, trainer, loop summary, validations, seconds)
    once per seed, each model's rollouts scored; ``folders`` are the dataset's and then the extra datasets' folders."""
    extra_sims = []  # (label, steps, frames, spec) of every extra simulation, read once for all seeds
    for extra_dir in folders[1:]:
        extra_manifest = load_manifest(extra_dir)
        extra_sims += [(f"{extra_dir.name}/{sim_id}", bench.extra_steps, *load_simulation(extra_dir, extra_manifest, sim_id, spec.options.resolved_recipe().condition))
                       for sim_id in sorted(extra_manifest["simulations"])]
    runs = [_train_once(train, spec.model_copy(update={"seed": spec.seed + i}), runtime, bench.test_steps, extra_sims) for i in range(bench.repeats)]
    reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
    return {
        "device": runtime.description, "recipe": spec.options.resolved_recipe().name, "batch_size": spec.batch_sizes[0],
        "time_budget_s": spec.time_budget, "epoch_limit": spec.epochs, "seeds": [r["seed"] for r in runs],
        "target": {"vorticity": spec.options.target_vorticity, "steps": spec.options.target_steps},
        "runs_reaching_target": len(reached), "time_to_target_median_s": statistics.median(reached) if reached else None,
        "time_to_target_min_s": min(reached, default=None), "time_to_target_max_s": max(reached, default=None),
        "test_horizon_vorticity_median": statistics.median(r["test"]["horizon_vorticity"] for r in runs),
        "test_horizon_u_median": statistics.median(r["test"]["horizon_u"] for r in runs),
        "runs": runs,
    }


def _train_once(train, spec: TrainSpec, runtime, test_steps: int, extra_sims: list) -> dict:
    """One seed: trained, its test rollout and the extra simulations' scored, its step and the solver's timed."""
    data, trainer, summary, validations, train_s = train(spec)
    generator, ctx, codec = trainer.generator.eval(), runtime.ctx, data.codec
    test_sim_id = data.split["test"][0]
    test_frames, test_sim = load_simulation(data.dataset_dir, data.manifest, test_sim_id, data.recipe.condition)
    test = score_generator(generator, ctx.device, codec, test_frames, test_sim, spec.options.stride, test_steps)
    surrogate_s = _surrogate_step_s(generator, ctx, codec, test_frames[0])
    solver = _solver_cost(test_sim, ctx.kind, torch.get_num_threads())
    result = {
        "seed": spec.seed, "epochs": summary.epochs, "steps": summary.steps, "train_s": train_s, "stopped_by": summary.ended_by,
        "samples_per_s": summary.samples_seen / train_s, "final_losses": summary.final_losses,
        "time_to_target_s": summary.time_to_target_s, "epochs_to_target": summary.epochs_to_target, "samples_to_target": summary.samples_to_target,
        "validations": validations.rows, "test_simulation": test_sim_id,
        "test": _scores(test.summary()),
        "surrogate_step_s": surrogate_s, "solver_step_s": solver[0], "solver": solver[1],
        # one network step replaces one stored frame's worth of solver steps (stride 1)
        "surrogate_s_per_time_unit": surrogate_s / test.dt, "solver_s_per_time_unit": solver[0] / test.dt,
        "surrogate_speedup": solver[0] / surrogate_s,
    }
    for label, extra_steps, frames, sim in extra_sims:
        scored = score_generator(generator, ctx.device, codec, frames, sim, spec.options.stride, extra_steps).summary()
        result.setdefault("extra", {})[label] = {"steps": extra_steps, **_scores(scored)}
    return result


def _scores(summary: dict) -> dict:
    """The reported scores, to five significant digits; a score that could not be measured (NaN) is None in the JSON."""
    return {k: (float(f"{v:.5g}") if math.isfinite(v) else None) if isinstance(v, float) else v
            for k, v in summary.items() if k in TEST_SCORES}


@torch.no_grad()
def _surrogate_step_s(generator, ctx, codec: StepCodec, frame: np.ndarray, repeats: int = 20) -> float:
    """Median seconds of one rollout step at batch 1: upload, network, download and decode."""
    state = frame  # (4, H, W) physical

    def step() -> None:
        out = generator(torch.from_numpy(codec.norm.encode(state)[None]).to(ctx.device)).float().cpu().numpy()[0]
        codec.next_state(state, out)

    for _ in range(3):
        step()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _solver_cost(sim, kind: str, threads: int) -> tuple[float, str]:
    """Seconds for the solver to advance one stored frame (frame_every steps) on this device: the torch
    backend on a GPU, numba on the surrogate's ``threads`` cores otherwise."""
    from models.karman.solver.timing import time_solver

    return time_solver(sim.flow_config(), sim.frame_every, "cuda" if kind == "cuda" else "cpu", threads)
