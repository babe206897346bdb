"""bench-solver: the solver's full production step (collision, streaming, obstacle, walls, inflow and outflow) in MLUPS.

Imports no Prefect or MLflow."""

import statistics
from dataclasses import replace

import numpy as np

from models.karman.solver import Backend, ChannelSolver, FlowConfig, SolverBatch, backend_from_name
from models.karman.solver import roofline
from models.karman.solver.timing import bench_config, timed_advances
from tasks.common.measures.ceiling import cpu_name, datasheet_bandwidth


def bench_batch_configs(nx: int, ny: int, dtype: str, batch: int) -> list[FlowConfig]:
    """``batch`` bench flows, their Reynolds numbers spread over ±20 % around bench_config's (one: it alone)."""
    base = bench_config(nx, ny, dtype)
    spread = np.linspace(0.8, 1.2, batch) if batch > 1 else np.ones(1)
    return [replace(base, reynolds=base.reynolds * s) for s in spread]


class _Batch:
    """``spec.batch`` simulations in one fused launch per step (bench_batch_configs), behind the ``advance``
    that timed_advances calls."""

    def __init__(self, spec):  # tasks.bench.specs.BenchSolverSpec
        configs = bench_batch_configs(spec.nx, spec.ny, spec.dtype, spec.batch)
        self.batch = SolverBatch(configs, [None] * len(configs), device=spec.device, storage=spec.dtype)

    def advance(self, steps: int) -> None:
        self.batch.advance(steps)


def bench_solver(spec) -> dict:  # spec: tasks.bench.specs.BenchSolverSpec
    """Median MLUPS over ``spec.repeats`` timed runs of ``spec.steps`` steps, after an untimed run that compiles
    (and, for triton on cuda, captures the CUDA graphs)."""
    nx, ny, steps, backend, dtype, repeats, device = spec.nx, spec.ny, spec.steps, spec.backend, spec.dtype, spec.repeats, spec.device
    kind = backend_from_name(backend)
    if kind.batched:
        solver = _Batch(spec)
    else:
        solver = ChannelSolver(bench_config(nx, ny, dtype), backend=backend, device=device)
    itemsize = np.dtype(dtype).itemsize
    flag_bytes = 1 if kind.batched else 0  # the fused kernel reads a one-byte cell flag
    copier = _copier(kind, device, spec.batch * roofline.population_bytes(ny, nx, itemsize))
    copies: list[float] = []
    between = (lambda: copies.extend(copier.once() for _ in range(COPIES))) if copier else None
    seconds = timed_advances(solver, steps, repeats, _synchroniser(kind, device), warmup=steps, between=between)
    rates = [spec.batch * nx * ny * steps / t / 1e6 for t in seconds]
    return {
        "mlups": statistics.median(rates), "backend": backend, "dtype": dtype, "batch": spec.batch,
        "steps_per_second": steps / statistics.median(seconds),  # of each simulation
        "bytes_per_update": roofline.bytes_per_cell(itemsize, flag_bytes),  # nine populations read and written (and the cell flag)
        "nx": nx, "ny": ny, "steps": steps, "repeats": repeats, "mlups_runs": [round(r, 1) for r in rates],
        "device": device if kind.on_device else "cpu",
        **_roofline(rates, copies, roofline.bytes_per_cell(itemsize, flag_bytes), copier),
    }


GPU_COPY_BYTES = 1 << 30  # each copy buffer on a GPU at least (an H100's L2 holds 50 MB)
COPIES = 10  # copies timed before each solver run and after the last (at 4096 x 1024, about a tenth of a second)


def _copier(backend: Backend, device: str, nbytes: int) -> roofline.NumbaCopy | roofline.TorchCopy | None:
    """The copy the solver's run is held against: on a CUDA GPU torch's device-to-device copy, on the CPU
    numba's parallel copy on the solver's threads (the NumPy reference runs on one); none on other devices."""
    if device.startswith("cuda"):  # from device memory: buffers far larger than any L2 cache
        return roofline.TorchCopy(max(nbytes, GPU_COPY_BYTES), device)
    if device != "cpu" or backend.batched:  # XLA devices; Triton's CPU interpreter is no measure of a CPU
        return None
    return roofline.NumbaCopy(nbytes, threads=1 if backend.single_threaded else None)


def _roofline(rates: list[float], copies: list[float], cell_bytes: int, copier) -> dict:
    """The run's memory roofline: the copy bandwidth measured between its timed runs (median), the MLUPS it
    allows at the bytes a cell update moves, and the fraction of it reached (of the medians; and per timed
    run, against the copies just before and after it, as the bandwidth a shared host leaves drifts); on a
    GPU with a known datasheet bandwidth, that too. Nothing where no copy was measured."""
    if copier is None:
        return {}
    copy_gbs = statistics.median(copies)
    around = [statistics.median(copies[k * COPIES : (k + 2) * COPIES]) for k in range(len(rates))]
    out = {"copy_gbs": copy_gbs, "copy_gbs_runs": [round(c, 1) for c in copies], "copy_bytes": copier.nbytes,
           "bytes_per_cell": cell_bytes, "roofline_mlups": roofline.roofline_mlups(copy_gbs, cell_bytes),
           "roofline_fraction": roofline.roofline_fraction(statistics.median(rates), copy_gbs, cell_bytes),
           "roofline_fraction_runs": [round(roofline.roofline_fraction(r, c, cell_bytes), 3) for r, c in zip(rates, around)]}
    if copier.device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(copier.device))
        known = datasheet_bandwidth(name)
        return {**out, "gpu": name, "datasheet_gbs": known[0] if known else None, "datasheet_source": known[1] if known else None}
    return {**out, "cpu": cpu_name(), "threads": copier.threads}


def _synchroniser(backend: Backend, device: str):
    if backend.on_device and device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None
