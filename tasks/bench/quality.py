"""bench-quality: time to quality of a recipe on one device, its rollout scores and its cost against the solver's.

Trains a recipe on a stored dataset held in the device's memory, scores validation rollouts as it
goes, and reports when the quality target was first met, the test rollout's scores, and the surrogate's cost per simulated time unit against the
solver's on the same device.

It is the training run of ``python -m flows train`` without its bookkeeping: the same split, normaliser,
recipe, trainer, validation and target, but no MLflow run, checkpoint or child process, and the whole
training set on the device instead of read batch by batch. It imports no Prefect or MLflow, so it runs
on a machine that has only the compute and data stack (numpy, numba, torch, zarr, pydantic).
"""

import dataclasses
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from models.device import keep_freed_memory, resolve_device
from models.nets.trainer import OptimConfig, build_trainer, speed_options
from models.recipe import get_recipe, lr_factor, schedule_progress
from tasks.common.data import IN_MEMORY_BYTES, Normalizer, PairSource, StepCodec, epoch_order, epoch_seed, split_of, training_net
from tasks.common.errors import RunFailed
from tasks.common.store import load_manifest
from tasks.infer.scoring import Validation, load_simulation, score_generator

# Rollout scores reported for the test simulation and each extra one.
TEST_SCORES = ("one_step_rel_l2_u", "one_step_rel_l2_vorticity", "one_step_skill_u", "one_step_skill_vorticity",
               "horizon_u", "horizon_vorticity", "strouhal_pred", "strouhal_ref", "strouhal_rel_error", "correlation_periods",
               "energy_ratio_final", "energy_ratio_max_deviation", "stable_steps", "finite", "shedding_amplitude_ratio")


@dataclasses.dataclass(frozen=True)
class QualityTarget:
    """Vorticity relative L2 at most ``vorticity`` for the first ``steps`` steps of every validation rollout."""

    vorticity: float = 0.3
    steps: int = 40


def bench_quality(dataset_dir: Path, device: str = "cpu", batch_size: int = 8, time_budget: float | None = None,
                  epochs: int | None = None, recipe: str = "default", overrides: dict | None = None, seeds: tuple[int, ...] = (0,),
                  target: QualityTarget = QualityTarget(), validate_every: int = 2, validate_steps: int = 60,
                  stop_at_target: bool = False, test_steps: int = 60, extra: tuple[tuple[Path, int], ...] = (),
                  threads: int | None = None, compile: str = "auto") -> dict:
    """Train ``recipe`` once per seed and report time to the quality target and the final rollouts.
    ``extra``: (dataset folder, steps) pairs: every simulation there is rolled out too (same geometry)."""
    if time_budget is None and epochs is None:
        raise ValueError("give a time budget or an epoch limit: without either the run has no end")
    if target.steps > validate_steps:
        raise ValueError(f"target steps {target.steps} exceed the validation rollout's {validate_steps} steps")
    chosen = get_recipe(recipe).with_overrides(**(overrides or {}))
    if threads:
        torch.set_num_threads(threads)
    ctx = resolve_device(device)
    if device == "cpu":
        keep_freed_memory()  # as the training child does
    extra_sims = []  # (label, steps, frames, spec) of every extra simulation, read once for all seeds
    for extra_dir, extra_steps in extra:
        extra_manifest = load_manifest(extra_dir)
        extra_sims += [(f"{extra_dir.name}/{sim_id}", extra_steps, *load_simulation(extra_dir, extra_manifest, sim_id))
                       for sim_id in sorted(extra_manifest["simulations"])]
    runs = [_train_once(dataset_dir, ctx, chosen, batch_size, time_budget, epochs, seed, target, validate_every,
                        validate_steps, stop_at_target, test_steps, extra_sims, compile) for seed in seeds]
    reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
    return {
        "device": ctx.description, "recipe": chosen.name, "batch_size": batch_size, "time_budget_s": time_budget,
        "epoch_limit": epochs, "seeds": list(seeds), "target": dataclasses.asdict(target),
        "runs_reaching_target": len(reached), "time_to_target_median_s": statistics.median(reached) if reached else None,
        "time_to_target_min_s": min(reached, default=None), "time_to_target_max_s": max(reached, default=None),
        "test_horizon_vorticity_median": statistics.median(r["test"]["horizon_vorticity"] for r in runs),
        "test_horizon_u_median": statistics.median(r["test"]["horizon_u"] for r in runs),
        "runs": runs,
    }


def _train_once(dataset_dir: Path, ctx, recipe, batch_size: int, time_budget: float | None, epochs: int | None, seed: int,
                target: QualityTarget, validate_every: int, validate_steps: int, stop_at_target: bool, test_steps: int,
                extra_sims: list, compile: str) -> dict:
    manifest = load_manifest(dataset_dir)
    split = split_of(manifest, 1, 1, seed)
    train = PairSource(dataset_dir, split["train"], 1, unroll=recipe.unroll)
    if train.nbytes * (2 + recipe.unroll) > IN_MEMORY_BYTES:  # the frames, then every pair's cond and targets
        raise ValueError(f"dataset {dataset_dir.name!r} is too large to train on from memory "
                         f"({train.nbytes / 2**30:.1f} GiB of frames, {2 + recipe.unroll} times that with the pairs; at most "
                         f"{IN_MEMORY_BYTES / 2**30:.0f} GiB): use python -m flows train, which reads batches from the store")
    train.hold_in_memory()
    norm = Normalizer.fit(train)
    codec = StepCodec(norm, train.change_rms().tolist() if recipe.predict == "delta" else None)
    net = training_net(train.height, train.width, None, ngf=recipe.ngf, ndf=recipe.ndf, norm="batch", dropout=recipe.dropout,
                       upsample=recipe.upsample, output=recipe.output)
    steps_per_epoch = len(train) // batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"batch size {batch_size} exceeds the {len(train)} training pairs")
    options = speed_options(ctx.kind, compile=compile)
    layout = torch.channels_last if options["channels_last"] else torch.contiguous_format
    # (N, 4, H, W), (N, 3·unroll, H, W) network units, on the device
    cond_all, target_all = (torch.from_numpy(a).to(ctx.device).contiguous(memory_format=layout)
                            for a in train.batch(np.arange(len(train)), norm))
    torch.manual_seed(seed)
    model = build_trainer(net, OptimConfig.from_recipe(recipe, codec.delta_ratio), ctx, options)
    validation = Validation.of(dataset_dir, manifest, split["val"], codec, net, 1, validate_every, validate_steps,
                               target.vorticity, target.steps)
    limit = epochs or 10**9
    history, reached_at, step, epoch, stopping = [], None, 0, 0, None
    t0 = time.perf_counter()
    while stopping is None and epoch < limit:
        epoch += 1
        model.train()
        torch.manual_seed(epoch_seed(seed, epoch))  # this epoch's input noise, as in training
        order = torch.from_numpy(epoch_order(len(train), seed, epoch)).to(ctx.device)
        for s in range(steps_per_epoch):
            if recipe.schedule != "constant":
                progress = schedule_progress(time.perf_counter() - t0, step, time_budget, limit * steps_per_epoch)
                model.set_lr_factor(lr_factor(recipe.schedule, progress))
            batch = order[s * batch_size : (s + 1) * batch_size]
            losses = model.train_step(cond_all[batch], target_all[batch], ctx.autocast)
            values = torch.stack([v.float() for v in losses.values()]).tolist()  # waits for the step: the clock below sees it done
            step += 1
            if not all(math.isfinite(v) for v in values):
                raise RunFailed(f"loss became non-finite at epoch {epoch}, step {step} (seed {seed}, recipe {recipe.name})")
            if time_budget and time.perf_counter() - t0 >= time_budget:
                stopping = "time budget"
                break
        last = stopping is not None or epoch == limit
        if validation.due(epoch, last):
            quality = validation.score(model.generator, ctx)
            train_s = time.perf_counter() - t0
            history.append({"train_s": round(train_s, 2), "epoch": epoch, "horizon_vorticity": quality["horizon_vorticity"],
                            "horizon_u": quality["horizon_u"], "one_step_rel_l2_vorticity": round(quality["one_step_rel_l2_vorticity"], 4)})
            if reached_at is None and validation.reached(quality):
                reached_at = {"time_to_target_s": train_s, "epochs_to_target": epoch, "samples_to_target": step * batch_size}
                if stop_at_target:
                    stopping = "target reached"
    train_s = time.perf_counter() - t0
    model.generator.eval()
    test_frames, test_sim = load_simulation(dataset_dir, manifest, split["test"][0])
    test = score_generator(model.generator, ctx.device, codec, test_frames, test_sim, 1, test_steps)
    surrogate_s = _surrogate_step_s(model.generator, ctx, codec, test_frames[0])
    solver = _solver_cost(test_sim, ctx.kind, torch.get_num_threads())
    result = {
        "seed": seed, "epochs": epoch, "steps": step, "train_s": train_s, "stopped_by": stopping or "epoch limit",
        "samples_per_s": step * batch_size / train_s, "time_to_target_s": None, "epochs_to_target": None, "samples_to_target": None,
        **(reached_at or {}), "validations": history, "test_simulation": split["test"][0],
        "test": _scores(test.summary()),
        "surrogate_step_s": surrogate_s, "solver_step_s": solver[0], "solver": solver[1],
        # one network step replaces one stored frame's worth of solver steps (stride 1)
        "surrogate_s_per_time_unit": surrogate_s / test.dt, "solver_s_per_time_unit": solver[0] / test.dt,
        "surrogate_speedup": solver[0] / surrogate_s,
    }
    for label, extra_steps, frames, sim in extra_sims:
        summary = score_generator(model.generator, ctx.device, codec, frames, sim, 1, extra_steps).summary()
        result.setdefault("extra", {})[label] = {"steps": extra_steps, **_scores(summary)}
    return result


def _scores(summary: dict) -> dict:
    """The reported scores, rounded; a score that could not be measured (NaN) is None in the JSON."""
    return {k: (round(v, 5) if math.isfinite(v) else None) if isinstance(v, float) else v
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
    from tasks.bench.solver import time_solver

    return time_solver(sim.flow_config(), sim.frame_every, "cuda" if kind == "cuda" else "cpu", threads)
