"""The channel-flow solver: geometry, initial state and a stepper chosen by backend name."""

from enum import Enum
from typing import Callable

import numpy as np

from models.solver import numpy_backend
from models.solver.collision import equilibrium, moments, trt_rates
from models.solver.config import FlowConfig
from models.solver.geometry import channel_nodes
from models.solver.lattice import CS2, SOLID


class Backend(str, Enum):
    NUMPY = "numpy"
    NUMBA = "numba"


def _numba_stepper() -> Callable:
    from models.solver.numba_backend import step_kernel

    def step(fpost, fnew, nodes, u_in, wp, wm):
        step_kernel(fpost, fnew, nodes, u_in, wp, wm)
        return fnew

    return step


def _numpy_stepper() -> Callable:
    def step(fpost, fnew, nodes, u_in, wp, wm):
        return numpy_backend.step(fpost, nodes, u_in, wp, wm)

    return step


_STEPPERS: dict[Backend, Callable[[], Callable]] = {Backend.NUMPY: _numpy_stepper, Backend.NUMBA: _numba_stepper}


def backend_from_name(name: str) -> Backend:
    """The backend called ``name``; ValueError listing the valid names otherwise."""
    try:
        return Backend(name)
    except ValueError:
        valid = ", ".join(b.value for b in Backend)
        raise ValueError(f"unknown solver backend {name!r}; choose one of {valid}") from None


class ChannelSolver:
    """Lattice-Boltzmann D2Q9 TRT solver for flow past an obstacle in a channel."""

    def __init__(self, config: FlowConfig, backend: Backend | str = Backend.NUMBA, nodes: np.ndarray | None = None):
        self.config = config.validate() if nodes is None else config
        self.backend = backend_from_name(backend) if isinstance(backend, str) else backend
        self.nodes = channel_nodes(config.ny, config.nx, config.obstacle) if nodes is None else nodes
        self.dtype = np.dtype(config.dtype)
        self.u_in = config.inflow_profile().astype(np.float64)
        self.omega_plus, self.omega_minus = trt_rates(config.tau)
        self.time = 0
        ux = np.where(self.nodes == SOLID, 0.0, self.u_in[:, None] * np.ones((1, config.nx)))
        rho = np.ones((config.ny, config.nx))
        self.f = equilibrium(rho, ux, np.zeros_like(ux)).astype(self.dtype)
        self.f[:, self.nodes == SOLID] = 0
        self._spare = np.empty_like(self.f)
        self._step = _STEPPERS[self.backend]()

    def perturb(self, seed: int, amplitude: float = 0.01) -> None:
        """Add a small seeded transverse velocity to the fluid (breaks the symmetry that delays shedding)."""
        rng = np.random.default_rng(seed)
        rho, ux, uy = self.macroscopic()
        uy = uy + amplitude * self.config.u_max * rng.standard_normal(uy.shape)
        solid = self.nodes == SOLID
        self.f = equilibrium(rho, ux, np.where(solid, 0.0, uy)).astype(self.dtype)
        self.f[:, solid] = 0

    def step(self, n: int = 1) -> None:
        """Advance ``n`` time steps; raise FloatingPointError if the state stops being finite."""
        for _ in range(n):
            out = self._step(self.f, self._spare, self.nodes, self.u_in, self.omega_plus, self.omega_minus)
            self._spare, self.f = self.f, out
        self.time += n
        if not np.isfinite(self.f[:, self.config.ny // 2, :].sum()):
            raise FloatingPointError(
                f"simulation diverged (NaN/inf) by step {self.time} at Re {self.config.reynolds:g}, "
                f"tau {self.config.tau:.4f}"
            )

    def macroscopic(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Density and velocity (ny, nx) in lattice units; zero velocity in solids."""
        rho, ux, uy = moments(self.f.astype(np.float64))
        solid = self.nodes == SOLID
        rho = np.where(solid, 1.0, rho)
        return rho, np.where(solid, 0.0, ux), np.where(solid, 0.0, uy)

    def fields(self) -> dict[str, np.ndarray]:
        """Dimensionless snapshot: u, v over the mean inflow, pressure coefficient-like p over
        rho0·U², vorticity over U/D, and the obstacle mask (all (ny, nx) float32)."""
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
        return float(self.f.astype(np.float64).sum())


def vorticity(u: np.ndarray, v: np.ndarray, solid: np.ndarray | None = None) -> np.ndarray:
    """Vorticity dv/dx - du/dy by central differences on a unit grid (..., ny, nx); zero in solids."""
    dvdx = np.gradient(v, axis=-1)
    dudy = np.gradient(u, axis=-2)
    w = dvdx - dudy
    return w if solid is None else np.where(solid, 0.0, w)
