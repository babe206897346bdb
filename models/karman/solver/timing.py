"""Wall-clock timing of the solver: the seconds a step costs, the figure a surrogate's rollout is compared with, and the benchmark channel it is timed on."""

import statistics
import time

from models.karman.solver.config import FlowConfig
from models.karman.solver.geometry import Obstacle
from models.karman.solver.solver import ChannelSolver

BENCH_TAU = 0.6  # any stable relaxation time: the cost of a step does not depend on it


def bench_config(nx: int, ny: int, dtype: str) -> FlowConfig:
    """The benchmark channel (bench-solver's, and the frame bench-infer's surrogate is timed on): ny x nx nodes with a
    cylinder an eighth of its height across, a height from the inlet."""
    size = max(2.0, ny / 8)
    u_max = 0.1
    viscosity = (BENCH_TAU - 0.5) / 3
    return FlowConfig(nx=nx, ny=ny, reynolds=(2 / 3) * u_max * size / viscosity, u_max=u_max, dtype=dtype,
                      obstacle=Obstacle(shape="circle", cx=min(ny / 2, nx / 4), cy=ny / 2 + 0.25, size=size))


def timed_advances(solver: ChannelSolver, steps: int, repeats: int, sync, warmup: int = 2, between=None) -> list[float]:
    """Seconds of ``repeats`` runs of ``steps`` steps each, after ``warmup`` steps that compile and touch the memory.
    ``between``, if given, is called before each run and after the last, outside the timed spans."""
    solver.advance(warmup)
    runs = []
    for _ in range(repeats):
        if between:
            between()
        sync()
        t0 = time.perf_counter()
        solver.advance(steps)
        sync()
        runs.append(time.perf_counter() - t0)
    if between:
        between()
    return runs


def time_solver(config: FlowConfig, steps: int, device: str, workers: int, repeats: int = 3) -> tuple[float, str]:
    """Median seconds for the solver to advance ``steps`` steps of ``config``'s flow, and which solver: the
    fastest backend of the device. On cpu the numba kernel on ``workers`` cores (the surrogate's compute
    units), on cuda the fused triton kernel (one launch per step, CUDA graphs), otherwise the numba kernel
    on every host core."""
    import numba

    if device == "cuda":
        import torch

        solver, sync = ChannelSolver(config, backend="triton", device="cuda"), torch.cuda.synchronize
        name = "fused triton kernel on cuda"
    else:
        solver, sync = ChannelSolver(config, backend="numba"), lambda: None
        name = f"numba on {workers if device == 'cpu' else numba.config.NUMBA_NUM_THREADS} cores"
    threads = min(workers if device == "cpu" else numba.config.NUMBA_NUM_THREADS, numba.config.NUMBA_NUM_THREADS)
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        runs = timed_advances(solver, steps, repeats, sync, warmup=max(2, steps) if device == "cuda" else 2)  # cuda: graphs captured
    finally:
        numba.set_num_threads(before)
    return statistics.median(runs), name
