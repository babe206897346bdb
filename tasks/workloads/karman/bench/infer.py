"""karman's part of bench-infer: one rollout step of its Pix2Pix generator in frames/s, full-frame or map-reduce over workers, against the solver; imports no Prefect or MLflow."""

import statistics
import time

import numpy as np

from models.karman.solver import ChannelSolver
from models.karman.solver.timing import bench_config, time_solver


def bench_frame(height: int, width: int, warmup_steps: int = 200) -> np.ndarray:
    """A flow frame (4, H, W) in network units (u, v, p scaled to about [-1, 1], mask as -1/1) from the
    solver on the benchmark channel after ``warmup_steps`` steps."""
    solver = ChannelSolver(bench_config(width, height, "float32"), backend="numba")
    solver.perturb(0)
    solver.advance(warmup_steps)
    f = solver.fields()
    frame = np.stack([f["u"] / 2, f["v"] / 2, f["p"] / max(float(np.abs(f["p"]).max()), 1e-6), 2 * f["mask"] - 1])
    return frame.astype(np.float32)


def bench_infer(spec, seed: int = 0) -> dict:
    """Frames/s of one rollout step of the Pix2Pix generator (``ngf`` wide, depth log2(train_size),
    weights drawn from ``seed``) on a size x width flow frame, full-frame or map-reduce over ``workers``,
    against the solver advancing the same frame at the same resolution.

    In the same process (``compare``) it also times full-frame and map-reduce on one worker; timed
    blocks of ``frames`` autoregressive steps alternate between the configurations, ``repeats`` each,
    and each reports its median block. ``compile_s`` is the first step's time above a warm step. ``spec`` is
    bench-infer's (tasks.bench.specs.BenchInferSpec), passed in by the shared command through ``Workload.bench_infer``.
    """
    mode, workers, size, width, tile, halo = spec.mode, spec.workers, spec.size, spec.width, spec.tile, spec.halo
    train_size, ngf, group, frames, repeats = spec.train_size, spec.ngf, spec.group, spec.frames, spec.repeats
    frame_stride, frame_every, device, compare = spec.frame_stride, spec.frame_every, spec.device, spec.compare
    import torch

    from models.device import resolve_device
    from models.host import cpu_cores
    from models.karman.inference import Predictor, make_runner
    from models.karman.nets.config import NetConfig
    from models.karman.nets.pix2pix import build_generator
    from models.karman.tiling import TilePlan

    if mode not in ("full", "mapreduce"):
        raise ValueError(f"unknown mode {mode!r}; choose full or mapreduce")
    if mode == "full" and workers != 1:
        raise ValueError(f"full-frame runs on one worker, got --workers {workers}; use --mode mapreduce to spread a frame over workers")
    if device == "cpu" and workers > cpu_cores():
        raise ValueError(f"{workers} workers requested but this host has {cpu_cores()} CPU cores; use at most {cpu_cores()}")
    width = width or 4 * size
    net = NetConfig(in_channels=4, out_channels=3, size=train_size, ngf=ngf)
    unit = 2**net.generator_depth
    net.check_image(size, width)
    if tile is None:  # two strips overlapping by 2 x halo, rounded up to the U-Net's stride unit
        tile = (size, min(width, -(-(width // 2 + halo) // unit) * unit))
    frame_every = frame_every or max(1, round(50 * size / 64))  # the demo's 50 steps per frame at 64 cells, scaled
    ctx = resolve_device(device, data_parallel=device == "xla" and workers > 1)
    torch.manual_seed(seed)
    model = build_generator(net).to(ctx.device).eval()
    configs = [(mode, workers)]
    if compare:
        configs += [c for c in (("full", 1), ("mapreduce", 1)) if c not in configs and (mode == "mapreduce" or c[0] == "full")]
    plans = {(m, w): TilePlan(size, width, (size, width) if m == "full" else tile, halo, unit) for m, w in configs}
    frame = bench_frame(size, width)
    predictors = {}

    def run(key, n: int) -> tuple[float, "StepTimes"]:  # noqa: F821
        state, times = frame, None
        t0 = time.perf_counter()
        for _ in range(n):
            out, step = predictors[key](state)
            state = np.concatenate([out, frame[3:]])  # feed the prediction back, the mask fixed
            times = step if times is None else times + step
        return (time.perf_counter() - t0) / n, times

    try:
        for (m, w), plan in plans.items():
            predictors[(m, w)] = Predictor(plan, make_runner(model, ctx, w), group if m == "mapreduce" else None)
        cold = {key: run(key, 1)[0] for key in predictors}
        blocks = {key: [] for key in predictors}
        phases = {key: [] for key in predictors}
        for _ in range(repeats):
            for key in predictors:
                per_frame, times = run(key, frames)
                blocks[key].append(per_frame)
                phases[key].append(times)
        full_out, _ = predictors[("full", 1)](frame) if ("full", 1) in predictors else (None, None)
        main_out, _ = predictors[(mode, workers)](frame)
    finally:
        for p in reversed(list(predictors.values())):
            p.close()
    if full_out is None:
        with Predictor(TilePlan(size, width, (size, width), 0, unit), make_runner(model, ctx, 1)) as p:
            full_out, _ = p(frame)
    seam = float(np.linalg.norm(main_out - full_out) / max(np.linalg.norm(full_out), 1e-12))

    warm = {key: statistics.median(v) for key, v in blocks.items()}
    key = (mode, workers)
    median_block = sorted(range(repeats), key=lambda i: blocks[key][i])[repeats // 2]
    split = phases[key][median_block]
    solver_s, solver_name = time_solver(bench_config(width, size, "float32"), frame_stride * frame_every, device, workers)
    plan = predictors[key].plan
    result = {
        "frames_per_s": 1 / warm[key], "workers": workers, "mode": mode, "seam_rel_error": seam,
        "compile_s": max(cold[key] - warm[key], 0.0), "solver_frames_per_s": 1 / solver_s,
        "device": device, "device_name": ctx.description, "height": size, "width": width, "tile": list(plan.tile),
        "halo": halo, "tiles": plan.count, "tile_overhead": plan.overhead, "group": predictors[key].group,
        "ngf": ngf, "depth": net.generator_depth, "cold_s": cold[key], "warm_s": warm[key],
        "latency_split_s": {k: v / frames for k, v in vars(split).items()},
        "frames_per_s_runs": [round(1 / t, 4) for t in blocks[key]],
        "frame_stride": frame_stride, "solver_steps_per_frame": frame_stride * frame_every,
        "solver": solver_name, "solver_mlups": width * size * frame_stride * frame_every / solver_s / 1e6,
        "surrogate_vs_solver": solver_s / warm[key],
        # the smallest stride k at which one network step beats the solver advancing k frames
        "crossover_stride": int(np.ceil(warm[key] / (solver_s / frame_stride))),
    }
    for other in predictors:
        if other != key:
            result[f"{other[0]}_{other[1]}_frames_per_s"] = 1 / warm[other]
    if mode == "mapreduce" and ("full", 1) in warm and ("mapreduce", 1) in warm:
        result["mapreduce_1_over_full_1"] = warm[("mapreduce", 1)] / warm[("full", 1)]
    if ("mapreduce", 1) in warm and key != ("mapreduce", 1):
        result["speedup_over_1_worker"] = warm[("mapreduce", 1)] / warm[key]
    return result
