"""bench-quality: time to quality of a recipe on one device, its rollout scores and its cost against the solver's.

It trains through the same loop, runtime, workload trainer, split, normaliser, recipe, validation
and target as ``python -m flows train`` (tasks.common.training.loop), in this process, with a recorder that
keeps the validations in memory and sends nothing anywhere: no MLflow run, checkpoint or child
process. It imports no Prefect or MLflow, so it runs on a machine that has only the compute and data
stack (numpy, numba, torch, zarr, pydantic). Then, for karman, it scores the test rollout and times the
surrogate's step against the solver's on the same device; for another workload it scores the test split as
``train`` does (the workload trainer's ``finish``, its files kept in a temporary folder only).
"""

import logging
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tasks.bench.specs import BenchQualitySpec
from tasks.common.settings import Settings
from tasks.common.specs import TrainSpec
from tasks.common.store import load_manifest
from tasks.common.training import loop
from tasks.common.training.runtime_torch import TorchRuntime
from tasks.workloads import check_options, framework_module, get_workload
from tasks.workloads.karman.data import StepCodec
from tasks.workloads.karman.scoring import load_simulation, score_generator

log = logging.getLogger("karman.bench")

# Rollout scores reported for the test simulation and each extra one.
TEST_SCORES = ("one_step_rel_l2_u", "one_step_rel_l2_vorticity", "one_step_skill_u", "one_step_skill_vorticity",
               "horizon_u", "horizon_vorticity", "strouhal_pred", "strouhal_ref", "strouhal_rel_error", "correlation_periods",
               "energy_ratio_final", "energy_ratio_max_deviation", "stable_steps", "finite", "shedding_amplitude_ratio",
               "horizon_vorticity_lagged", "final_lag_steps", "horizon_vorticity_lowpass", "frequency_rel_error_phase", "phase_lag_final",
               "correlation_steps", "correlation_time", "band_error_low_final", "band_error_mid_final", "band_error_high_final",
               "acdm_mse_60", "acdm_mse_60_inc_units", "mgn_rmse_1", "mgn_rmse_50", "mgn_rmse_600")


class Validations:
    """The loop's recorder here: keeps each validation's scores against training time, sends nothing."""

    def __init__(self):
        self.rows: list[dict] = []

    def steps(self, rows) -> None:
        pass

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        scores = {k.removeprefix("val_"): round(v, 4) for k, v in metrics.items() if k.startswith("val_")}
        if scores:
            self.rows.append({"train_s": round(metrics["train_time_s"], 2), "epoch": epoch, **scores})


class KeptArtifacts:
    """What a workload trainer's ``finish`` logs, kept where it was written (a temporary folder here): the paths only."""

    def __init__(self):
        self.paths: list[str] = []

    def log_artifact(self, path, artifact_path: str | None = None) -> None:
        self.paths.append(str(path))


def bench_quality(bench: BenchQualitySpec) -> dict:
    """Train ``bench``'s spec once per seed (seed, seed + 1, ...) and report time to the quality target
    and the final rollouts; every simulation of each extra dataset is rolled out too (same geometry)."""
    settings = Settings.from_env()
    spec, repeats, test_steps = bench.train_spec(), bench.repeats, bench.test_steps
    workload = get_workload(spec.workload)
    check_options(spec)
    if not workload.rollouts and bench.extra_dataset:
        raise ValueError(f"--extra-dataset rolls out trained models on more datasets; the {spec.workload} workload has no rollouts")
    folders = [settings.dataset_dir(name) for name in [bench.dataset, *bench.extra_dataset]]
    for folder in folders:
        if not (folder / "manifest.json").is_file():
            raise ValueError(f"no dataset at {folder} (no manifest.json); make one with python -m flows generate --dataset {folder.name}")
    if spec.time_budget is None and spec.epochs is None:
        raise ValueError("give a time budget or an epoch limit: without either the run has no end")
    if not workload.rollouts:
        return _bench_workload(settings, spec, repeats)
    extra = tuple((folder, bench.extra_steps) for folder in folders[1:])
    extra_sims = []  # (label, steps, frames, spec) of every extra simulation, read once for all seeds
    for extra_dir, extra_steps in extra:
        extra_manifest = load_manifest(extra_dir)
        extra_sims += [(f"{extra_dir.name}/{sim_id}", extra_steps, *load_simulation(extra_dir, extra_manifest, sim_id, spec.resolved_recipe().condition))
                       for sim_id in sorted(extra_manifest["simulations"])]
    workload.check(settings, spec, spec.batch_sizes, 1)
    runtime = TorchRuntime(spec.device, spec.precision, spec.threads, data_parallel=False)
    runs = [_train_once(settings, spec.model_copy(update={"seed": spec.seed + i}), runtime, test_steps, extra_sims) for i in range(repeats)]
    reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
    return {
        "device": runtime.description, "recipe": spec.resolved_recipe().name, "batch_size": spec.batch_sizes[0],
        "time_budget_s": spec.time_budget, "epoch_limit": spec.epochs, "seeds": [r["seed"] for r in runs],
        "target": {"vorticity": spec.target_vorticity, "steps": spec.target_steps},
        "runs_reaching_target": len(reached), "time_to_target_median_s": statistics.median(reached) if reached else None,
        "time_to_target_min_s": min(reached, default=None), "time_to_target_max_s": max(reached, default=None),
        "test_horizon_vorticity_median": statistics.median(r["test"]["horizon_vorticity"] for r in runs),
        "test_horizon_u_median": statistics.median(r["test"]["horizon_u"] for r in runs),
        "runs": runs,
    }


def _bench_workload(settings, spec: TrainSpec, repeats: int) -> dict:
    """A workload other than karman: train once per seed until its target or budget, then its test split's scores."""
    workload = get_workload(spec.workload)
    workload.check(settings, spec, spec.batch_sizes, 1)
    runtime = TorchRuntime(spec.device, spec.precision, spec.threads, data_parallel=False)
    runs = []
    for i in range(repeats):
        run_spec = spec.model_copy(update={"seed": spec.seed + i})
        _, trainer, summary, validations, train_s = _trained(settings, run_spec, runtime)
        with tempfile.TemporaryDirectory() as folder:
            test = trainer.finish(Path(folder), KeptArtifacts(), settings)
        runs.append({"seed": run_spec.seed, "epochs": summary.epochs, "steps": summary.steps, "train_s": train_s, "stopped_by": summary.ended_by,
                     "samples_per_s": summary.samples_seen / train_s, "s_per_epoch": train_s / max(summary.epochs, 1),
                     "final_losses": summary.final_losses, "time_to_target_s": summary.time_to_target_s,
                     "epochs_to_target": summary.epochs_to_target, "validations": validations.rows, "test": test})
    reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
    facts = workload.dataset_info(settings, spec.dataset)[1]  # the dataset's own account: har's may be real or synthetic
    return {"workload": spec.workload, "synthetic": facts.get("synthetic", workload.synthetic), **({"data": facts["data"]} if "data" in facts else {}), "device": runtime.description, "batch_size": spec.batch_sizes[0],
            "time_budget_s": spec.time_budget, "epoch_limit": spec.epochs, "seeds": [r["seed"] for r in runs],
            "runs_reaching_target": len(reached), "time_to_target_median_s": statistics.median(reached) if reached else None,
            "samples_per_s_median": statistics.median(r["samples_per_s"] for r in runs), "runs": runs}


def _trained(settings, spec: TrainSpec, runtime: TorchRuntime) -> tuple:
    """The workload's torch trainer for ``spec``, trained through the one loop: (data, trainer, loop summary,
    validations, seconds)."""
    workload = get_workload(spec.workload)
    data = workload.prepare(settings, spec)
    trainer = framework_module(workload, "torch").build(data, spec, spec.batch_sizes[0], runtime)
    validations = Validations()
    t0 = time.perf_counter()
    summary = loop.train(trainer, runtime, validations, spec, spec.batch_sizes[0], None, log, announce=False)
    return data, trainer, summary, validations, time.perf_counter() - t0


def _train_once(settings, spec: TrainSpec, runtime: TorchRuntime, test_steps: int, extra_sims: list) -> dict:
    data, trainer, summary, validations, train_s = _trained(settings, spec, runtime)
    generator, ctx, codec = trainer.generator.eval(), runtime.ctx, data.codec
    test_sim_id = data.split["test"][0]
    test_frames, test_sim = load_simulation(data.dataset_dir, data.manifest, test_sim_id, data.recipe.condition)
    test = score_generator(generator, ctx.device, codec, test_frames, test_sim, spec.stride, test_steps)
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
        scored = score_generator(generator, ctx.device, codec, frames, sim, spec.stride, extra_steps).summary()
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
    from models.solver.timing import time_solver

    return time_solver(sim.flow_config(), sim.frame_every, "cuda" if kind == "cuda" else "cpu", threads)
