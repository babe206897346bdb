"""bench-solver: the solver's full production step (collision, streaming, obstacle, walls, inflow and outflow) in MLUPS.

Imports no Prefect or MLflow."""

import statistics
import time
from dataclasses import replace

import numpy as np

from models.solver import ChannelSolver, FlowConfig, Obstacle
from models.solver.timing import timed_advances
from tasks.bench.specs import BenchSolverSpec

BENCH_TAU = 0.6  # any stable relaxation time: the cost of a step does not depend on it


def bench_config(nx: int, ny: int, dtype: str) -> FlowConfig:
    """A channel of ny x nx nodes with a cylinder an eighth of its height across, a height from the inlet."""
    size = max(2.0, ny / 8)
    u_max = 0.1
    viscosity = (BENCH_TAU - 0.5) / 3
    return FlowConfig(nx=nx, ny=ny, reynolds=(2 / 3) * u_max * size / viscosity, u_max=u_max, dtype=dtype,
                      obstacle=Obstacle(shape="circle", cx=min(ny / 2, nx / 4), cy=ny / 2 + 0.25, size=size))


class _Batch:
    """``spec.batch`` simulations in one fused launch per step, Reynolds numbers spread over ±20 % around the
    bench flow's, behind the ``advance`` that timed_advances calls."""

    def __init__(self, spec: BenchSolverSpec):
        from models.solver.triton_backend import FusedBatch

        base = bench_config(spec.nx, spec.ny, spec.dtype)
        spread = np.linspace(0.8, 1.2, spec.batch) if spec.batch > 1 else np.ones(1)
        solvers = [ChannelSolver(replace(base, dtype=base.array_dtype, reynolds=base.reynolds * s), backend="numpy") for s in spread]
        self.fused = FusedBatch([s.plan for s in solvers], np.stack([s.f for s in solvers]), device=spec.device, storage=spec.dtype)

    def advance(self, steps: int) -> None:
        self.fused.run(steps, np.zeros((0, 2), np.int64))


def bench_solver(spec: BenchSolverSpec) -> dict:
    """Median MLUPS over ``spec.repeats`` timed runs of ``spec.steps`` steps, after an untimed run that compiles
    (and, for triton on cuda, captures the CUDA graphs)."""
    nx, ny, steps, backend, dtype, repeats, device = spec.nx, spec.ny, spec.steps, spec.backend, spec.dtype, spec.repeats, spec.device
    if backend == "triton":
        solver = _Batch(spec)
    else:
        solver = ChannelSolver(bench_config(nx, ny, dtype), backend=backend, device=device)
    seconds = timed_advances(solver, steps, repeats, _synchroniser(backend, device), warmup=steps)
    rates = [spec.batch * nx * ny * steps / t / 1e6 for t in seconds]
    itemsize = 2 if dtype == "float16s" else np.dtype(dtype).itemsize
    return {
        "mlups": statistics.median(rates), "backend": backend, "dtype": dtype, "batch": spec.batch,
        "steps_per_second": steps / statistics.median(seconds),  # of each simulation
        "bytes_per_update": 2 * 9 * itemsize + (1 if backend == "triton" else 0),  # nine populations read and written, the cell flag
        "nx": nx, "ny": ny, "steps": steps, "repeats": repeats, "mlups_runs": [round(r, 1) for r in rates],
        "device": device if backend in ("torch", "triton") else "cpu",
    }


def _synchroniser(backend: str, device: str):
    if backend in ("torch", "triton") and device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None
