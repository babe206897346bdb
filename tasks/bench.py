"""Benchmarks behind ``python -m flows bench-…``: the solver's full production step (collision,
streaming, obstacle, walls, inflow and outflow) in MLUPS, and Pix2Pix training in samples/s against a
plain eager implementation. Imports no Prefect or MLflow, so it runs on any machine that has the
compute stack (numpy, numba, torch)."""

import contextlib
import json
import statistics
import time
from pathlib import Path

import numpy as np

from models.solver import ChannelSolver, FlowConfig, Obstacle

BENCH_TAU = 0.6  # any stable relaxation time: the cost of a step does not depend on it


def bench_config(nx: int, ny: int, dtype: str) -> FlowConfig:
    """A channel of ny x nx nodes with a cylinder an eighth of its height across, a height from the inlet."""
    size = max(2.0, ny / 8)
    u_max = 0.1
    viscosity = (BENCH_TAU - 0.5) / 3
    return FlowConfig(nx=nx, ny=ny, reynolds=(2 / 3) * u_max * size / viscosity, u_max=u_max, dtype=dtype,
                      obstacle=Obstacle(shape="circle", cx=min(ny / 2, nx / 4), cy=ny / 2 + 0.25, size=size))


def bench_solver(nx: int, ny: int, steps: int, backend: str = "numba", dtype: str = "float32",
                 repeats: int = 5, device: str = "cpu") -> dict:
    """Median MLUPS over ``repeats`` timed runs of ``steps`` steps, after a warm-up that compiles."""
    config = bench_config(nx, ny, dtype)
    solver = ChannelSolver(config, backend=backend, device=device)
    rates = [nx * ny * steps / t / 1e6 for t in _timed_advances(solver, steps, repeats, _synchroniser(backend, device))]
    itemsize = np.dtype(dtype).itemsize
    return {
        "mlups": statistics.median(rates), "backend": backend, "dtype": dtype,
        "bytes_per_update": 2 * 9 * itemsize,  # nine populations read and written per node
        "nx": nx, "ny": ny, "steps": steps, "repeats": repeats, "mlups_runs": [round(r, 1) for r in rates],
        "device": device if backend == "torch" else "cpu",
    }


def _timed_advances(solver: ChannelSolver, steps: int, repeats: int, sync) -> list[float]:
    """Seconds of ``repeats`` runs of ``steps`` steps each, after a warm-up that compiles and touches the memory."""
    solver.advance(2)
    runs = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        solver.advance(steps)
        sync()
        runs.append(time.perf_counter() - t0)
    return runs


def _synchroniser(backend: str, device: str):
    if backend == "torch" and device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


# ---------------------------------------------------------------------------------------------
# Training throughput

# Dense bf16 tensor-core peaks (TFLOP/s) of GPUs we know, by a substring of the device name.
GPU_PEAK_BF16_TFLOPS = {"H200": 989.4, "H100 SXM": 989.4, "H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H100 NVL": 835.0,
                        "A100": 312.0, "A6000": 154.8, "L40S": 362.0, "L4": 121.0}


def _plain_step(gen, disc, opt_g, opt_d, cond, target, l1_weight: float) -> None:
    """The textbook eager float32 Pix2Pix step the trainer is compared with: same networks, losses
    and update order, default (multi-tensor) Adam, and D's weight gradients computed during the
    generator's update too (then discarded), as a plain implementation does."""
    import torch
    import torch.nn.functional as F

    fake = gen(cond)
    opt_d.zero_grad()
    real, fake_d = disc(cond, target), disc(cond, fake.detach())
    loss_d = 0.5 * (F.binary_cross_entropy_with_logits(real, torch.ones_like(real))
                    + F.binary_cross_entropy_with_logits(fake_d, torch.zeros_like(fake_d)))
    loss_d.backward()
    opt_d.step()
    opt_g.zero_grad()
    fake_g = disc(cond, fake)
    loss_g = F.binary_cross_entropy_with_logits(fake_g, torch.ones_like(fake_g)) + l1_weight * (fake - target).abs().mean()
    loss_g.backward()
    opt_g.step()


def _synthetic_batch(batch_size: int, size: int, seed: int):
    """(cond (B, 4, S, S) with an obstacle mask in channel 3, target (B, 3, S, S)) in network units."""
    import torch

    gen_cpu = torch.Generator().manual_seed(seed)
    cond = torch.rand(batch_size, 4, size, size, generator=gen_cpu) * 2 - 1
    cond[:, 3] = torch.where(cond[:, 3] > 0.8, 1.0, -1.0)
    target = torch.tanh(torch.randn(batch_size, 3, size, size, generator=gen_cpu))
    return cond, target


class _PlainTrainer:
    """The plain step's networks, optimisers and batch; ``run(n)`` times n steps in seconds."""

    def __init__(self, size: int, batch_size: int, seed: int, ctx):
        import torch

        from models.nets import NetConfig, build_discriminator, build_generator

        net = NetConfig(in_channels=4, out_channels=3, size=size)
        torch.manual_seed(seed)
        self.gen, self.disc = build_generator(net).to(ctx.device), build_discriminator(net).to(ctx.device)
        self.opt_g = torch.optim.Adam(self.gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.opt_d = torch.optim.Adam(self.disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.cond, self.target = (t.to(ctx.device) for t in _synthetic_batch(batch_size, size, seed))
        self.ctx = ctx

    def run(self, n: int) -> float:
        return _timed_steps(self.ctx, n, lambda: _plain_step(self.gen, self.disc, self.opt_g, self.opt_d, self.cond, self.target, 100.0))


def _timed_steps(ctx, n: int, step) -> float:
    """Seconds for n calls of ``step``, each ending the device's step, the device synchronised at both ends."""
    ctx.sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
        ctx.step_end()
    ctx.sync()
    return time.perf_counter() - t0


def plain_step_server() -> None:
    """Child side of ``_PlainProcess``: a CPU process left with its default settings. Reads one JSON
    line (size, batch_size, seed, threads), warms up, answers "ready", then for each line holding a
    step count runs that many plain steps and answers the seconds taken."""
    import sys

    import torch

    from models.device import resolve_device

    config = json.loads(sys.stdin.readline())
    torch.set_num_threads(config["threads"])
    plain = _PlainTrainer(config["size"], config["batch_size"], config["seed"], resolve_device("cpu"))
    plain.run(2)
    print("ready", flush=True)
    for line in sys.stdin:
        print(repr(plain.run(int(line))), flush=True)


class _PlainProcess:
    """The plain step in a separate CPU process with default settings (its C heap untouched by
    ``keep_freed_memory``), driven block by block from the benchmark process."""

    def __init__(self, size: int, batch_size: int, seed: int):
        import subprocess
        import sys

        import torch

        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from tasks.bench import plain_step_server; plain_step_server()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
        self._send(json.dumps({"size": size, "batch_size": batch_size, "seed": seed, "threads": torch.get_num_threads()}))
        if self._answer() != "ready":
            raise RuntimeError("the plain-step process did not start")

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _answer(self) -> str:
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"the plain-step process exited with status {self.proc.wait()}")
        return line

    def run(self, n: int) -> float:
        self._send(str(n))
        return float(self._answer())

    def close(self) -> None:
        self.proc.stdin.close()
        if self.proc.wait(timeout=60) != 0:
            raise RuntimeError(f"the plain-step process exited with status {self.proc.returncode}")


def bench_train(device: str = "cpu", size: int = 256, batch_size: int = 1, steps: int = 3, repeats: int = 3,
                precision: str = "fp32", baseline: bool = True, peak_tflops: float | None = None, seed: int = 0) -> dict:
    """Training samples/s of the default Pix2Pix networks on synthetic (B, 4, size, size) -> (B, 3, ...)
    pairs with the trainer's speed options, against the plain eager fp32 step.

    On CPU the trainer's process keeps freed memory (as a training child does, see
    ``keep_freed_memory``); the plain step runs twice: in a separate process with default settings
    (``baseline_samples_per_s``, ``speedup``: what a plain script gets) and in the benchmark's own
    process (``same_process_baseline_samples_per_s``, ``speedup_same_process``: the code's share
    alone). On GPUs and XLA only the latter, reported as the baseline. Timed blocks of ``steps``
    steps alternate between the sides (``repeats`` each) so drifts of the machine hit all alike;
    each side reports its median block. ``compile_s`` is the trainer's first step (warm-up,
    compilation)."""
    import torch

    from models.device import keep_freed_memory, resolve_device
    from models.nets import NetConfig
    from models.nets.trainer import OptimConfig, build_trainer, speed_options

    net = NetConfig(in_channels=4, out_channels=3, size=size)
    net.check_image(size, size)
    ctx = resolve_device(device, precision)
    options = speed_options(device, precision) | {"keep_freed_memory": device == "cpu" and keep_freed_memory()}
    torch.manual_seed(seed)
    model = build_trainer(net, OptimConfig(), ctx, options)
    cond, target = (t.to(ctx.device) for t in _synthetic_batch(batch_size, size, seed))
    if options["channels_last"]:
        cond, target = cond.contiguous(memory_format=torch.channels_last), target.contiguous(memory_format=torch.channels_last)

    def run_fast(n: int) -> float:
        return _timed_steps(ctx, n, lambda: model.train_step(cond, target, ctx.autocast))

    compile_s = run_fast(1)
    run_fast(1)
    sides = {"fast": run_fast}
    with contextlib.ExitStack() as stack:
        if baseline:
            same = _PlainTrainer(size, batch_size, seed, ctx)
            same.run(2)
            sides["same"] = same.run
            if device == "cpu":
                child = _PlainProcess(size, batch_size, seed)
                stack.callback(child.close)
                sides["child"] = child.run
        times = {key: [] for key in sides}
        for _ in range(repeats):
            for key, run in sides.items():
                times[key].append(run(steps))

    def rate(key: str) -> float:
        return batch_size * steps / statistics.median(times[key])

    def runs(key: str) -> list[float]:
        return [round(batch_size * steps / t, 4) for t in times[key]]

    flops = _flops_per_sample(net)
    result = {
        "samples_per_s": rate("fast"), "in_channels": net.in_channels, "out_channels": net.out_channels,
        "generator_params": sum(p.numel() for p in model.generator.parameters()),
        "discriminator_params": sum(p.numel() for p in model.discriminator.parameters()),
        "compile_s": compile_s, "device": device, "device_name": ctx.description, "size": size, "batch_size": batch_size,
        "steps": steps, "repeats": repeats, "precision": precision, "options": options,
        "samples_per_s_runs": runs("fast"),
        "flops_per_sample": flops,
        "achieved_tflops": flops * rate("fast") / 1e12 if flops else None,
    }
    if baseline:
        base = "child" if "child" in times else "same"
        result |= {"baseline_samples_per_s": rate(base), "speedup": rate("fast") / rate(base),
                   "baseline_samples_per_s_runs": runs(base), "baseline_process": "separate" if base == "child" else "same"}
        if base == "child":
            result |= {"same_process_baseline_samples_per_s": rate("same"), "speedup_same_process": rate("fast") / rate("same"),
                       "same_process_baseline_samples_per_s_runs": runs("same")}
    peak = peak_tflops or _known_peak(ctx, precision)
    result["peak_tflops"] = peak
    result["mfu"] = flops * rate("fast") / (peak * 1e12) if (flops and peak) else None
    return result


def _flops_per_sample(net) -> float:
    """Model FLOPs of one training step of the trainer (D frozen during G's update) per sample,
    counted by torch on the CPU for a batch of one: the count depends on neither device nor batch."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from models.nets.trainer import OptimConfig, Pix2Pix

    model = Pix2Pix(net, OptimConfig())
    cond = torch.zeros(1, net.in_channels, net.size, net.size)
    target = torch.zeros(1, net.out_channels, net.size, net.size)
    with FlopCounterMode(display=False) as counter:
        model.train_step(cond, target, contextlib.nullcontext)
    return float(counter.get_total_flops())


def _known_peak(ctx, precision: str) -> float | None:
    if ctx.kind != "cuda" or precision != "bf16":
        return None
    name = ctx.description
    return next((v for k, v in GPU_PEAK_BF16_TFLOPS.items() if k in name), None)


# ---------------------------------------------------------------------------------------------
# Inference throughput

def bench_frame(height: int, width: int, warmup_steps: int = 200) -> np.ndarray:
    """A flow frame (4, H, W) in network units (u, v, p scaled to about [-1, 1], mask as -1/1) from the
    solver on the benchmark channel after ``warmup_steps`` steps."""
    solver = ChannelSolver(bench_config(width, height, "float32"), backend="numba")
    solver.perturb(0)
    solver.advance(warmup_steps)
    f = solver.fields()
    frame = np.stack([f["u"] / 2, f["v"] / 2, f["p"] / max(float(np.abs(f["p"]).max()), 1e-6), 2 * f["mask"] - 1])
    return frame.astype(np.float32)


def bench_infer(mode: str = "mapreduce", workers: int = 1, size: int = 256, width: int | None = None,
                tile: tuple[int, int] | None = None, halo: int = 16, train_size: int = 64, ngf: int = 64,
                group: int | None = None, frames: int = 3, repeats: int = 3, frame_stride: int = 1,
                frame_every: int | None = None, device: str = "cpu", compare: bool = True, seed: int = 0) -> dict:
    """Frames/s of one rollout step of the Pix2Pix generator (``ngf`` wide, depth log2(train_size))
    on a size x width flow frame, full-frame or map-reduce over ``workers``, against the solver
    advancing the same frame at the same resolution.

    In the same process (``compare``) it also times full-frame and map-reduce on one worker; timed
    blocks of ``frames`` autoregressive steps alternate between the configurations, ``repeats`` each,
    and each reports its median block. ``compile_s`` is the first step's time above a warm step.
    """
    import torch

    from models.device import resolve_device
    from models.inference import Predictor, cpu_cores, make_runner
    from models.nets import NetConfig, build_generator
    from models.tiling import TilePlan

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


def time_solver(config: FlowConfig, steps: int, device: str, workers: int, repeats: int = 3) -> tuple[float, str]:
    """Median seconds for the solver to advance ``steps`` steps of ``config``'s flow, and which solver:
    on cpu the numba kernel on ``workers`` cores (the surrogate's compute units), on cuda the torch
    backend on the GPU, otherwise the numba kernel on every host core."""
    import numba

    if device == "cuda":
        import torch

        solver, sync, name = ChannelSolver(config, backend="torch", device="cuda"), torch.cuda.synchronize, "torch on cuda"
    else:
        solver, sync = ChannelSolver(config, backend="numba"), lambda: None
        name = f"numba on {workers if device == 'cpu' else numba.config.NUMBA_NUM_THREADS} cores"
    threads = min(workers if device == "cpu" else numba.config.NUMBA_NUM_THREADS, numba.config.NUMBA_NUM_THREADS)
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        runs = _timed_advances(solver, steps, repeats, sync)
    finally:
        numba.set_num_threads(before)
    return statistics.median(runs), name
