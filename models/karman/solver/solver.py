"""The channel-flow solver: geometry, initial state and a stepper chosen by backend name."""

from dataclasses import replace
from enum import Enum

import numpy as np

from models.karman.solver import numpy_backend
from models.karman.solver.collision import equilibrium, moments
from models.karman.solver.config import FlowConfig
from models.karman.solver.lattice import CS2, SOLID
from models.karman.solver.operators import StepPlan, plan_for

NO_PROBES = np.zeros((0, 2), np.int64)


class Backend(str, Enum):
    """A solver backend, and what the stages ask of it (never by its name)."""

    NUMPY = "numpy"
    NUMBA = "numba"
    TORCH = "torch"
    TRITON = "triton"

    @property
    def on_device(self) -> bool:
        """It runs on the solver's device (a CUDA GPU through torch); the others run on the CPU whatever device is named."""
        return self in (Backend.TORCH, Backend.TRITON)

    @property
    def batched(self) -> bool:
        """It steps a batch of simulations in one fused launch (SolverBatch) and reads a one-byte cell flag per cell."""
        return self is Backend.TRITON

    @property
    def single_threaded(self) -> bool:
        """The reference operators: one thread, so a roofline holds it against a one-thread copy."""
        return self is Backend.NUMPY


def backend_from_name(name: str) -> Backend:
    """The backend called ``name``; ValueError listing the valid names otherwise."""
    try:
        return Backend(name)
    except ValueError:
        valid = ", ".join(b.value for b in Backend)
        raise ValueError(f"unknown solver backend {name!r}; choose one of {valid}") from None


class NumpyStepper:
    """The reference operators, one step at a time."""

    def __init__(self, plan: StepPlan, f: np.ndarray):
        self.plan, self.f = plan, f

    def set_plan(self, plan: StepPlan) -> None:
        self.plan = plan

    def finite(self, row: int) -> bool:
        return bool(np.isfinite(self.f[:, row]).all())

    def run(self, steps: int, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        forces, rho = np.zeros((steps, 2)), np.zeros((steps, len(probes)))
        for t in range(steps):
            self.f, forces[t] = numpy_backend.step(self.f, self.plan)
            rho[t] = self.f[:, probes[:, 0], probes[:, 1]].sum(axis=0)
        return forces, rho

    def state(self) -> np.ndarray:
        return self.f


class NumbaStepper:
    """The fused kernels on padded planes (see numba_backend), many steps per call."""

    def __init__(self, plan: StepPlan, f: np.ndarray):
        from models.karman.solver import numba_backend

        self.kernels, self.plan, self.shape = numba_backend, plan, f.shape[1:]
        # both buffers start from the same values: ghost populations that no step writes stay as set here
        self.f = numba_backend.to_planes(f)
        self.spare = self.f.copy()

    def set_plan(self, plan: StepPlan) -> None:
        self.plan = plan

    def run(self, steps: int, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p, (ny, nx) = self.plan, self.shape
        forces, rho = np.zeros((steps, 2)), np.zeros((steps, len(probes)))
        swapped = self.kernels.advance(
            self.f, self.spare, ny, nx, steps, p.omega_plus, p.omega_minus, p.periodic, p.cells, p.kind, p.coef,
            p.solid, p.inlet_u, p.u_convect, p.outlet_anchor, forces, probes, rho,
        )
        if swapped:
            self.f, self.spare = self.spare, self.f
        return forces, rho

    def state(self) -> np.ndarray:
        return self.kernels.from_planes(self.f, *self.shape)

    def finite(self, row: int) -> bool:
        nx = self.shape[1]
        return bool(np.isfinite(self.f[:, row * nx : (row + 1) * nx]).all())


class TritonStepper:
    """The fused GPU kernel (see triton_backend) on a batch of one simulation."""

    def __init__(self, plan: StepPlan, f: np.ndarray, device: str, storage: str):
        from models.karman.solver.triton_backend import FusedBatch

        self.batch = FusedBatch([plan], f[None], device=device, storage=storage)

    def set_plan(self, plan: StepPlan) -> None:
        self.batch.set_inflow(plan.inlet_u[None])

    def run(self, steps: int, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        forces, rho = self.batch.run(steps, probes)
        return forces[:, 0], rho[:, 0]

    def state(self) -> np.ndarray:
        return self.batch.state()[0]

    def finite(self, row: int) -> bool:
        return self.batch.finite(row)


def _torch_stepper(plan: StepPlan, f: np.ndarray, device: str):
    from models.karman.solver.torch_backend import TorchStepper

    return TorchStepper(plan, f, device)


class ChannelSolver:
    """Lattice-Boltzmann D2Q9 TRT solver for flow past an obstacle in a channel.

    ``periodic=True`` wraps the same obstacle in a box periodic in x and y (no walls, inlet or outlet),
    and ``obstacle=False`` leaves the obstacle out: boxes that check conservation. ``device`` is for the
    torch backend (cpu, cuda, ...). The fluid starts with the inflow profile everywhere, or at rest
    (``at_rest``, for a start that ramps the inflow up with ``set_inflow_scale``).
    """

    def __init__(self, config: FlowConfig, backend: Backend | str = Backend.NUMBA, periodic: bool = False,
                 obstacle: bool = True, device: str = "cpu", at_rest: bool = False):
        self.config = config.validate()
        self.backend = backend_from_name(backend) if isinstance(backend, str) else backend
        self.plan = self._full_inflow = plan_for(config, periodic=periodic, obstacle=obstacle)
        self.at_rest = at_rest
        self.nodes = self.plan.nodes
        self.dtype = np.dtype(config.dtype)
        self.time = 0
        self.u_in = config.inflow_profile()
        self.device = device
        self._stepper = self._make_stepper(self._initial_state())

    def _initial_state(self) -> np.ndarray:
        """Equilibrium at rest density with the inflow profile everywhere in the fluid."""
        solid = self.nodes == SOLID
        ux = np.where(solid | self.at_rest, 0.0, self.u_in[:, None] * np.ones((1, self.config.nx)))
        f = equilibrium(np.ones(ux.shape), ux, np.zeros_like(ux))
        f[:, solid] = equilibrium(np.ones(1), np.zeros(1), np.zeros(1))
        return f.astype(self.dtype)

    def _make_stepper(self, f: np.ndarray):
        if self.plan.periodic:
            numpy_backend.wrap_periodic(f)
        if self.backend is Backend.NUMPY:
            return NumpyStepper(self.plan, f)
        if self.backend is Backend.NUMBA:
            return NumbaStepper(self.plan, f)
        if self.backend is Backend.TRITON:
            return TritonStepper(self.plan, f, self.device, self.config.dtype)
        return _torch_stepper(self.plan, f, self.device)

    def set_inflow_scale(self, scale: float) -> None:
        """Scale the inflow velocity (1 = the configured profile) from the next step on."""
        self.plan = replace(self._full_inflow, inlet_u=self._full_inflow.inlet_u * scale)
        self._stepper.set_plan(self.plan)

    @property
    def f(self) -> np.ndarray:
        """Post-collision populations (9, ny, nx) as a NumPy array."""
        return self._stepper.state()

    def perturb(self, seed: int, amplitude: float = 0.01) -> None:
        """Add a small seeded transverse velocity to the fluid (breaks the symmetry that delays shedding)."""
        rng = np.random.default_rng(seed)
        rho, ux, uy = self.macroscopic()
        uy = uy + amplitude * self.config.u_max * rng.standard_normal(uy.shape)
        solid = self.nodes == SOLID
        f = equilibrium(rho, ux, np.where(solid, 0.0, uy))
        f[:, solid] = self._initial_state()[:, solid]
        self._stepper = self._make_stepper(f.astype(self.dtype))

    def advance(self, steps: int, probes: np.ndarray = NO_PROBES) -> tuple[np.ndarray, np.ndarray]:
        """Run ``steps`` steps; return the force on the obstacle per step (steps, 2) and the density at the
        ``probes`` nodes ((np, 2) rows of (y, x)) per step. FloatingPointError once the state stops being
        finite."""
        forces, rho = self._stepper.run(steps, np.ascontiguousarray(probes, dtype=np.int64))
        self.time += steps
        if not (np.isfinite(forces).all() and self._stepper.finite(self.config.ny // 2)):
            raise FloatingPointError(
                f"simulation diverged (NaN/inf) by step {self.time} at Re {self.config.reynolds:g}, "
                f"tau {self.config.tau:.4f}"
            )
        return forces, rho

    def step(self, n: int = 1) -> None:
        """Advance ``n`` time steps."""
        self.advance(n)

    def macroscopic(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Density and velocity (ny, nx) in lattice units: zero velocity in solids, the inflow at the inlet
        column and the last fluid column's state at the outlet column."""
        rho, ux, uy = moments(self.f.astype(np.float64))
        if not self.plan.periodic:
            for a in (rho, ux, uy):
                a[:, -1] = a[:, -2]
            rho[:, 0], ux[:, 0], uy[:, 0] = rho[:, 1], self.u_in, 0.0
        solid = self.nodes == SOLID
        return np.where(solid, 1.0, rho), np.where(solid, 0.0, ux), np.where(solid, 0.0, uy)

    def fields(self) -> dict[str, np.ndarray]:
        """Dimensionless snapshot: u, v over the mean inflow, pressure over rho0·U² (zero mean over the
        fluid), vorticity over U/D, and the solid mask (all (ny, nx) float32)."""
        rho, ux, uy = self.macroscopic()
        u_ref, size = self.config.u_mean, self.config.obstacle.size
        u, v = ux / u_ref, uy / u_ref
        p = (rho - 1.0) * CS2 / (u_ref * u_ref)
        solid = self.nodes == SOLID
        return {
            "u": u.astype(np.float32),
            "v": v.astype(np.float32),
            "p": np.where(solid, 0.0, p - p[~solid].mean()).astype(np.float32),
            "vorticity": (vorticity(u, v, solid) * size).astype(np.float32),
            "mask": solid.astype(np.float32),
        }

    def total_mass(self) -> float:
        """Mass of the simulated nodes (the interior; ghost and wall nodes hold boundary values)."""
        interior = self.f[:, 1:-1, 1:-1].astype(np.float64)
        return float(interior[:, (self.nodes[1:-1, 1:-1] != SOLID)].sum())


def vorticity(u: np.ndarray, v: np.ndarray, solid: np.ndarray | None = None) -> np.ndarray:
    """Vorticity dv/dx - du/dy by central differences on a unit grid (..., ny, nx); zero in solids."""
    dvdx = np.gradient(v, axis=-1)
    dudy = np.gradient(u, axis=-2)
    w = dvdx - dudy
    return w if solid is None else np.where(solid, 0.0, w)


class _Member:
    """One simulation of a SolverBatch as its ChannelSolver's stepper: the state is the batch's, copied from
    the device once per step count and shared by the members."""

    def __init__(self, batch: "SolverBatch", index: int):
        self.batch, self.index = batch, index

    def set_plan(self, plan: StepPlan) -> None:
        raise ValueError("a batch member's inflow is set for the whole batch (SolverBatch)")

    def run(self, steps: int, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise ValueError("a batch member advances with its batch (SolverBatch.advance)")

    def state(self) -> np.ndarray:
        return self.batch.state()[self.index]

    def finite(self, row: int) -> bool:
        return bool(np.isfinite(self.state()[:, row]).all())


class SolverBatch:
    """Many simulations of one lattice size advanced together by the fused GPU kernel, one launch per step
    (each with its own geometry, Reynolds number and inflow). ``solvers`` gives each one's read side:
    ``fields()``, ``macroscopic()``, ``f`` of ChannelSolver, as the batch holds it after its last advance.
    Each starts as ChannelSolver would (``perturb`` seeds apply before the batch is built)."""

    def __init__(self, configs: list[FlowConfig], seeds: list[int | None], device: str = "cuda", storage: str = "float32"):
        from models.karman.solver.triton_backend import FusedBatch

        if len({(c.ny, c.nx) for c in configs}) != 1:
            raise ValueError(f"a batch needs one lattice size; got {sorted({(c.nx, c.ny) for c in configs})} (nx, ny)")
        self.solvers = []
        for config, seed in zip(configs, seeds):
            solver = ChannelSolver(config, backend=Backend.NUMPY)
            if seed is not None:
                solver.perturb(seed)
            self.solvers.append(solver)
        self.fused = FusedBatch([s.plan for s in self.solvers], np.stack([s.f for s in self.solvers]), device=device, storage=storage)
        self._state: tuple[int, np.ndarray] | None = None
        for index, solver in enumerate(self.solvers):
            solver._stepper = _Member(self, index)
        self.time = 0

    def state(self) -> np.ndarray:
        """Post-collision populations of every simulation (B, 9, ny, nx), as the NumPy reference holds them."""
        if self._state is None or self._state[0] != self.time:
            self._state = (self.time, self.fused.state())
        return self._state[1]

    def advance(self, steps: int) -> None:
        """Run ``steps`` steps of every simulation; FloatingPointError naming those whose state stopped being finite."""
        self.fused.run(steps, NO_PROBES)
        self.time += steps
        for solver in self.solvers:
            solver.time = self.time
        row = self.solvers[0].config.ny // 2
        bad = [s for s, ok in zip(self.solvers, self.fused.finite_each(row)) if not ok]
        if bad:
            names = ", ".join(f"Re {s.config.reynolds:g} ({s.config.obstacle.shape})" for s in bad)
            raise FloatingPointError(f"simulation(s) {names} diverged (NaN/inf) by step {self.time}")
