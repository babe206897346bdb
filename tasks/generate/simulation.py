"""One reference simulation (on a Dask worker), its snapshots stored as an xarray Dataset in the zarr store."""

import logging
import time
from pathlib import Path

import numpy as np
import xarray as xr

from models.solver import SOLVER_VERSION, ChannelSolver
from tasks.common.simulation import SimulationSpec
from tasks.common.store import VARIABLES, content_digest, write_simulation

log = logging.getLogger("karman.simulate")


def simulate(spec: SimulationSpec) -> tuple[xr.Dataset, dict]:
    """Run past the start-up transient, then take ``frames`` snapshots every ``frame_every`` steps."""
    import numba

    numba.set_num_threads(min(spec.threads, numba.config.NUMBA_NUM_THREADS))
    config = spec.flow_config().validate()
    solver = ChannelSolver(config, backend=spec.backend)
    solver.perturb(spec.seed)
    t0 = time.perf_counter()
    total = spec.warmup_steps + spec.frames * spec.frame_every
    report_every = max(total // 4, 1)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        solver.step(n)
        before, done = done, done + n
        if before // report_every != done // report_every:
            log.info("%s: step %d/%d", spec.sim_id, done, total)

    chunk = max(spec.frame_every, 1000)
    while done < spec.warmup_steps:
        advance(min(chunk, spec.warmup_steps - done))
    snaps = {name: [] for name in VARIABLES}
    for _ in range(spec.frames):
        advance(spec.frame_every)
        for name, value in solver.fields().items():
            snaps[name].append(value)
    wall = time.perf_counter() - t0
    mlups = config.nx * config.ny * total / wall / 1e6
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
    ds = xr.Dataset(
        {name: (("time", "y", "x"), np.stack(frames)) for name, frames in snaps.items()},
        coords={
            "time": ("time", steps * dt, {"units": "D/U"}),
            "step": ("time", steps),
            "y": ("y", np.arange(config.ny), {"units": "lattice cells"}),
            "x": ("x", np.arange(config.nx), {"units": "lattice cells"}),
        },
        attrs=attrs,
    )
    return ds, {"wall_s": wall, "mlups": mlups, "steps": total}


def run_simulation(dataset_dir: str, spec: SimulationSpec) -> dict:
    """Simulate and write one group; returns the manifest record. Runs on a Dask worker."""
    ds, stats = simulate(spec)
    digest = content_digest(ds)
    write_simulation(Path(dataset_dir), spec.sim_id, ds)
    return {"sim_id": spec.sim_id, "digest": digest, "frames": spec.frames, "spec": spec.model_dump(), **stats}
