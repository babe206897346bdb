"""karman's reference simulations: one on a Dask worker, or a batch on a GPU, its snapshots stored as an xarray Dataset in the zarr store."""

import itertools
import logging
import time
from pathlib import Path

import numpy as np
import xarray as xr

from models.karman.solver import SOLVER_VERSION, ChannelSolver
from tasks.common.config.errors import UserError
from tasks.common.specs import GenerateSpec
from tasks.common.stores.store import VARIABLES, content_digest, write_simulation
from tasks.workloads.karman.simulation import SimulationSpec

log = logging.getLogger("karman.simulate")


def expand(spec: GenerateSpec) -> list[SimulationSpec]:
    """One SimulationSpec per (shape, size, x position, y offset, Reynolds number), Reynolds number varying
    fastest; each validated before any step runs (UserError naming the member and the offending value)."""
    sweep, sims = spec.options, []
    for shape, size, x_position, y_offset, re in itertools.product(sweep.shapes, sweep.size, sweep.x_position, sweep.y_offset, sweep.reynolds):
        member = f"{shape} at Re {re:g}, size {size:g}, x position {x_position:g}, y offset {y_offset:g}"
        sim = SimulationSpec(
            nx=sweep.nx, ny=sweep.ny, reynolds=re, u_max=sweep.u_max, shape=shape, size=size,
            cx=x_position * sweep.ny, cy=0.5 * (sweep.ny - 1) + y_offset, aspect=sweep.aspect,
            warmup_steps=sweep.warmup_steps, frames=sweep.frames, frame_every=sweep.frame_every, seed=spec.seed,
            backend="triton" if spec.device == "cuda" else sweep.cpu_backend,
        )
        try:
            sim.flow_config().validate()
        except ValueError as exc:
            raise UserError(f"sweep member {member}: {exc}") from None
        sims.append(sim)
    return sims


def _frames_schedule(spec: SimulationSpec) -> tuple[int, int]:
    """Steps in all, and the chunk the warm-up advances by."""
    return spec.warmup_steps + spec.frames * spec.frame_every, max(spec.frame_every, 1000)


def simulate(spec: SimulationSpec) -> tuple[xr.Dataset, dict]:
    """Run past the start-up transient, then take ``frames`` snapshots every ``frame_every`` steps."""
    import numba

    numba.set_num_threads(min(spec.threads, numba.config.NUMBA_NUM_THREADS))
    config = spec.flow_config().validate()
    solver = ChannelSolver(config, backend=spec.backend)
    solver.perturb(spec.seed)
    t0 = time.perf_counter()
    total, chunk = _frames_schedule(spec)
    report_every = max(total // 4, 1)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        solver.step(n)
        before, done = done, done + n
        if before // report_every != done // report_every:
            log.info("%s: step %d/%d", spec.sim_id, done, total)

    while done < spec.warmup_steps:
        advance(min(chunk, spec.warmup_steps - done))
    snaps = {name: [] for name in VARIABLES}
    for _ in range(spec.frames):
        advance(spec.frame_every)
        for name, value in solver.fields().items():
            snaps[name].append(value)
    wall = time.perf_counter() - t0
    return _dataset(spec, snaps), {"wall_s": wall, "mlups": config.nx * config.ny * total / wall / 1e6, "steps": total}


def simulate_batch(specs: list[SimulationSpec], device: str = "cuda") -> list[tuple[xr.Dataset, dict]]:
    """The same simulations as ``simulate``, all advanced together by the fused GPU kernel (one launch per
    step; they share the lattice size and the frame schedule, as the members of a sweep do). ``wall_s`` is
    the batch's, and ``mlups`` each simulation's share of it."""
    from models.karman.solver import SolverBatch

    first = specs[0]
    schedule = {(s.nx, s.ny, s.warmup_steps, s.frames, s.frame_every) for s in specs}
    if len(schedule) != 1:
        raise ValueError(f"a batch shares its lattice and frame schedule; got {sorted(schedule)} (nx, ny, warmup, frames, every)")
    configs = [s.flow_config().validate() for s in specs]
    t0 = time.perf_counter()
    batch = SolverBatch(configs, [s.seed for s in specs], device=device)
    total, chunk = _frames_schedule(first)
    while batch.time < first.warmup_steps:
        batch.advance(min(chunk, first.warmup_steps - batch.time))
        log.info("batch of %d: step %d/%d", len(specs), batch.time, total)
    snaps = [{name: [] for name in VARIABLES} for _ in specs]
    for _ in range(first.frames):
        batch.advance(first.frame_every)
        for own, solver in zip(snaps, batch.solvers):
            for name, value in solver.fields().items():
                own[name].append(value)
    wall = time.perf_counter() - t0
    mlups = configs[0].nx * configs[0].ny * total / wall / 1e6
    return [(_dataset(s, own), {"wall_s": wall, "mlups": mlups, "steps": total}) for s, own in zip(specs, snaps)]


def _dataset(spec: SimulationSpec, snaps: dict[str, list[np.ndarray]]) -> xr.Dataset:
    """One simulation's snapshots as the Dataset the store holds, with every parameter as an attribute."""
    config = spec.flow_config()
    dt = 1.0 * config.u_mean / config.obstacle.size  # one lattice step in units of D/U
    attrs = {
        **config.attrs(),
        "warmup_steps": spec.warmup_steps,
        "frame_every": spec.frame_every,
        "seed": spec.seed,
        "dt_lattice": 1.0,
        "dt_convective": dt,
        "time_unit": "D/U (obstacle size over mean inflow velocity)",
        "solver_version": SOLVER_VERSION,
        "backend": spec.backend,
        "sim_id": spec.sim_id,
    }
    steps = spec.warmup_steps + spec.frame_every * np.arange(1, spec.frames + 1)
    return xr.Dataset(
        {name: (("time", "y", "x"), np.stack(frames)) for name, frames in snaps.items()},
        coords={
            "time": ("time", steps * dt, {"units": "D/U"}),
            "step": ("time", steps),
            "y": ("y", np.arange(config.ny), {"units": "lattice cells"}),
            "x": ("x", np.arange(config.nx), {"units": "lattice cells"}),
        },
        attrs=attrs,
    )


def run_simulation(dataset_dir: str, spec: SimulationSpec) -> dict:
    """Simulate and write one group; returns the manifest record. Runs on a Dask worker."""
    return _written(dataset_dir, spec, *simulate(spec))


def _written(dataset_dir: str, spec: SimulationSpec, ds: xr.Dataset, stats: dict) -> dict:
    digest = content_digest(ds)
    write_simulation(Path(dataset_dir), spec.sim_id, ds)
    return {"sim_id": spec.sim_id, "digest": digest, "frames": spec.frames, "spec": spec.model_dump(), **stats}


BATCH_BODY = "tasks.workloads.karman.simulate:simulate_batch_job"  # the GPU sweep's body, run in a child process


def simulate_batch_job(job: dict) -> dict:
    """Child job: simulate ``job["sims"]`` (SimulationSpec dicts) on ``job["device"]`` in as few batches as
    its free memory holds, writing each group into ``job["dataset_dir"]``; {"records": the manifest records}."""
    from models.karman.solver.triton_plan import batch_capacity

    specs = [SimulationSpec(**s) for s in job["sims"]]
    size = batch_capacity(specs[0].ny, specs[0].nx, "float32", job["device"])
    if size < 1:
        raise UserError(f"one simulation of {specs[0].nx}x{specs[0].ny} does not fit the free memory of {job['device']}; use a smaller grid")
    records = []
    for start in range(0, len(specs), size):
        group = specs[start : start + size]
        records += [_written(job["dataset_dir"], spec, ds, stats) for spec, (ds, stats) in zip(group, simulate_batch(group, job["device"]))]
    return {"records": records}
