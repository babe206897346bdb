"""The fused Triton kernel under Triton's CPU interpreter against the NumPy reference; run as a child process.

``python -m tests.models.triton_cases`` with TRITON_INTERPRET=1 set prints one JSON line of measured
differences, which tests/models/test_triton_solver.py asserts on. The interpreter must be chosen before
Triton is imported, so this runs apart from the test process. Grids are small: the interpreter runs each
program of a launch in Python (about half a second per step at 32 x 16). The interpreter's overflow checks, which a
compiled kernel makes only when built for debugging, are off (``as_compiled``); ``KARMAN_TRITON_SANITIZE=1`` keeps them.
"""

import json
import os
import sys

import numpy as np

from models.karman.solver import ChannelSolver, FlowConfig, Obstacle
from models.karman.solver.lattice import CX, CY
from models.karman.solver.triton_backend import FusedBatch, interpreting

PROBES = np.array([[5, 10], [12, 25]])


def channel(dtype: str, reynolds: float = 40.0, shape: str = "circle", aspect: float = 1.0, **kw) -> FlowConfig:
    return FlowConfig(nx=32, ny=16, reynolds=reynolds, u_max=0.1, dtype=dtype,
                      obstacle=Obstacle(shape=shape, cx=9.3, cy=8.2, size=5.5, aspect=aspect), **kw)


def difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def batch_of_two() -> dict:
    """Two simulations (circle Re 40, rectangle Re 30) in one launch, fp64, the inflow changed mid-run."""
    refs = [ChannelSolver(channel("float64"), backend="numpy"),
            ChannelSolver(channel("float64", 30.0, "rectangle", 1.5), backend="numpy")]
    for ref in refs:
        ref.perturb(seed=2)
    fused = FusedBatch([r.plan for r in refs], np.stack([r.f for r in refs]), device="cpu", storage="float64")
    first = fused.run(2, PROBES)
    expected_first = [r.advance(2, PROBES) for r in refs]
    for ref in refs:
        ref.set_inflow_scale(0.7)
    fused.set_inflow(np.stack([r.plan.inlet_u for r in refs]))
    second = fused.run(2, PROBES)
    expected_second = [r.advance(2, PROBES) for r in refs]
    state = fused.state()
    out = {"state": 0.0, "forces": 0.0, "probes": 0.0, "force_scale": 0.0}
    for b, ref in enumerate(refs):
        forces = np.concatenate([first[0][:, b], second[0][:, b]])
        rho = np.concatenate([first[1][:, b], second[1][:, b]])
        out["state"] = max(out["state"], difference(state[b], ref.f))
        out["forces"] = max(out["forces"], difference(forces, np.concatenate([expected_first[b][0], expected_second[b][0]])))
        out["probes"] = max(out["probes"], difference(rho, np.concatenate([expected_first[b][1], expected_second[b][1]])))
        out["force_scale"] = max(out["force_scale"], float(np.abs(expected_second[b][0]).max()))
    return out


def through_the_solver(dtype: str, reference_dtype: str) -> dict:
    """ChannelSolver(backend="triton") against the NumPy reference: ellipse, 4 steps."""
    config = channel(dtype, 40.0, "ellipse", 0.7)
    fused = ChannelSolver(config, backend="triton", device="cpu")
    ref = ChannelSolver(channel(reference_dtype, 40.0, "ellipse", 0.7), backend="numpy")
    fused.perturb(seed=3)
    ref.perturb(seed=3)
    forces, rho = fused.advance(4, PROBES)
    expected_forces, expected_rho = ref.advance(4, PROBES)
    return {"state": difference(fused.f, ref.f), "forces": difference(forces, expected_forces),
            "probes": difference(rho, expected_rho), "dtype": str(fused.f.dtype)}


def periodic_box() -> dict:
    """A periodic box without obstacle, fp64: mass and momentum before and after 4 steps, and the reference's state."""
    config = channel("float64")
    fused = ChannelSolver(config, backend="triton", device="cpu", periodic=True, obstacle=False)
    ref = ChannelSolver(config, backend="numpy", periodic=True, obstacle=False)
    fused.perturb(seed=4, amplitude=1.0)
    ref.perturb(seed=4, amplitude=1.0)

    def totals(f: np.ndarray) -> list[float]:
        f = f[:, 1:-1, 1:-1]
        return [float(f.sum()), float((CX[:, None, None] * f).sum()), float((CY[:, None, None] * f).sum())]

    before = totals(fused.f)
    fused.advance(4)
    ref.advance(4)
    return {"before": before, "after": totals(fused.f), "state": difference(fused.f, ref.f)}


def batched_sweep(folder: str) -> dict:
    """Two sweep members (Re 40 circle, Re 30 square) through generate's GPU job body on the interpreter,
    written into a zarr store, against the reference (numpy) simulation of each (the CPU path's numba kernel equals it: tests/models/test_solver.py)."""
    from tasks.workloads.karman.simulation import SimulationSpec
    from pathlib import Path

    from tasks.common.stores.store import VARIABLES, open_simulation
    from tasks.workloads.karman.simulate import simulate, simulate_batch_job

    sims = [SimulationSpec(nx=32, ny=16, reynolds=re, u_max=0.1, shape=shape, size=5.5, cx=9.3, cy=8.2, warmup_steps=2,
                           frames=2, frame_every=1, seed=7, backend="triton") for re, shape in ((40.0, "circle"), (30.0, "square"))]
    result = simulate_batch_job({"sims": [s.model_dump() for s in sims], "dataset_dir": folder, "device": "cpu"})
    out = {"records": len(result["records"]), "same_ids": [r["sim_id"] for r in result["records"]] == [s.sim_id for s in sims], "fields": 0.0}
    for sim in sims:
        stored = open_simulation(Path(folder), sim.sim_id)
        cpu, _ = simulate(sim.model_copy(update={"backend": "numpy"}))
        out["fields"] = max(out["fields"], *(difference(stored[v].values, cpu[v].values) for v in VARIABLES if v != "mask"))
        out["frames"] = int(stored.sizes["time"])
    return out


def as_compiled() -> None:
    """The interpreter checks every 32-bit integer add, subtract and multiply for overflow, about half of these
    cases' CPU time (80 → 41 s); a compiled kernel checks only when built with debug on, as ours never is. The cases run it as compiled
    (on these grids no index comes near 2**31)."""
    from dataclasses import replace

    from triton.runtime import interpreter

    interpreter.interpreter_builder.options = replace(interpreter.interpreter_builder.options, sanitize_overflow=False)


def main() -> int:
    if not interpreting():
        print("set TRITON_INTERPRET=1 before running these cases", file=sys.stderr)
        return 2
    if os.environ.get("KARMAN_TRITON_SANITIZE", "0") == "0":
        as_compiled()
    results = {
        "batch": batch_of_two(),
        "float32": through_the_solver("float32", "float32"),
        "periodic": periodic_box(),
        "sweep": batched_sweep(sys.argv[1]),
    }
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
