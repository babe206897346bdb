"""bench-solver: the solver's full production step (collision, streaming, obstacle, walls, inflow and outflow) in MLUPS.

Imports no Prefect or MLflow."""

import statistics
import time

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


def bench_solver(spec: BenchSolverSpec) -> dict:
    """Median MLUPS over ``spec.repeats`` timed runs of ``spec.steps`` steps, after a warm-up that compiles."""
    nx, ny, steps, backend, dtype, repeats, device = spec.nx, spec.ny, spec.steps, spec.backend, spec.dtype, spec.repeats, spec.device
    config = bench_config(nx, ny, dtype)
    solver = ChannelSolver(config, backend=backend, device=device)
    rates = [nx * ny * steps / t / 1e6 for t in timed_advances(solver, steps, repeats, _synchroniser(backend, device))]
    itemsize = np.dtype(dtype).itemsize
    return {
        "mlups": statistics.median(rates), "backend": backend, "dtype": dtype,
        "bytes_per_update": 2 * 9 * itemsize,  # nine populations read and written per node
        "nx": nx, "ny": ny, "steps": steps, "repeats": repeats, "mlups_runs": [round(r, 1) for r in rates],
        "device": device if backend == "torch" else "cpu",
    }


def _synchroniser(backend: str, device: str):
    if backend == "torch" and device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None
