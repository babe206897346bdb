"""The Schäfer & Turek (1996) flow around a cylinder, cases 2D-1 and 2D-2, for validating the solver.

2D-1 is steady (Re 20), 2D-2 periodic (Re 100); the benchmark's geometry, inflow and definitions.

Channel 2.2 x 0.41, cylinder of diameter D = 0.1 centred at (0.2, 0.2), parabolic inflow of peak U_m,
no-slip walls, kinematic viscosity 1e-3, density 1. Coefficients use the mean inflow U = 2/3 U_m:
c_D = 2 F_x / (rho U^2 D), c_L = 2 F_y / (rho U^2 D), St = D f / U, and Delta p is the pressure
difference between the cylinder's front (0.15, 0.2) and back (0.25, 0.2). In 2D-2, c_D,max and
c_L,max are taken over a period of the developed flow and Delta p at half a period after the lift's
maximum.
"""

import time
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from models.karman.solver.config import FlowConfig
from models.karman.solver.geometry import Obstacle
from models.karman.solver.lattice import CS2
from models.karman.solver.solver import ChannelSolver

Case = Literal["2D-1", "2D-2"]
CASES: tuple[str, ...] = ("2D-1", "2D-2")

# Reference intervals published by Schäfer & Turek (1996).
REFERENCE: dict[str, dict[str, tuple[float, float]]] = {
    "2D-1": {"cd": (5.57, 5.59), "cl": (0.0104, 0.0110), "dp": (0.1172, 0.1176)},
    "2D-2": {"cd_max": (3.22, 3.24), "cl_max": (0.99, 1.01), "st": (0.295, 0.305), "dp": (2.46, 2.50)},
}
U_PEAK = {"2D-1": 0.3, "2D-2": 1.5}  # m/s
# The mean inflow in lattice units, per case. The lattice Boltzmann method is weakly compressible: its
# error grows as the Mach number squared. The steady case's pressure difference is the most sensitive
# figure (about 3 rho U^2 across the cylinder): at 40 nodes per diameter it reads 0.11663 at 0.05,
# 0.11720 at 0.025 and 0.11726 at 0.02, against the interval 0.1172-0.1176, for the same number of
# steps (2D-1 settles in acoustic time). The periodic case is bound by resolution, not compressibility
# (c_L,max at 60 nodes: 0.988 at 0.05, 0.986 at 0.025), and a lower velocity costs it steps in
# proportion, so it keeps 0.05.
LATTICE_U_MEAN = {"2D-1": 0.02, "2D-2": 0.05}
MAX_LATTICE_U_MEAN = 0.1  # the inflow's peak is 1.5 times the mean: a Mach number of 0.26 at most
REYNOLDS = {"2D-1": 20.0, "2D-2": 100.0}
HEIGHT, LENGTH, DIAMETER, CENTRE = 0.41, 2.2, 0.1, 0.2


def within(value: float, interval: tuple[float, float], tolerance: float = 0.0) -> bool:
    """Whether ``value`` lies in ``interval`` widened by ``tolerance`` (a fraction) on each side."""
    lo, hi = interval
    return lo * (1 - tolerance) <= value <= hi * (1 + tolerance)


@dataclass(frozen=True)
class Setup:
    """The benchmark on a lattice of ``cells_per_diameter`` nodes across the cylinder."""

    case: Case
    cells_per_diameter: int
    u_mean: float | None = None  # lattice units; None: the case's LATTICE_U_MEAN

    def __post_init__(self):
        if self.case not in CASES:
            raise ValueError(f"unknown benchmark case {self.case!r}; choose one of {', '.join(CASES)}")
        n = self.cells_per_diameter
        if n < 10 or n % 10:
            raise ValueError(f"cells per diameter {n} must be a multiple of 10 and at least 10 (the channel is 4.1 diameters high)")
        if self.u_mean is not None and not 0 < self.u_mean <= MAX_LATTICE_U_MEAN:
            raise ValueError(f"lattice velocity {self.u_mean} must be above 0 and at most {MAX_LATTICE_U_MEAN} "
                             f"(the inflow's peak, 1.5 times the mean, then stays below Mach 0.26)")

    @property
    def lattice_u_mean(self) -> float:
        """The mean inflow in lattice units (the peak's Mach number is 1.5 sqrt(3) times it: 0.05 at 0.02, 0.13 at 0.05)."""
        return self.u_mean if self.u_mean is not None else LATTICE_U_MEAN[self.case]

    def config(self, dtype: str = "float64") -> FlowConfig:
        n = self.cells_per_diameter
        centre = 0.5 + CENTRE / DIAMETER * n  # walls and inflow plane sit half-way, at node coordinate 0.5
        return FlowConfig(
            nx=round(LENGTH / DIAMETER * n) + 2, ny=round(HEIGHT / DIAMETER * n) + 2, reynolds=REYNOLDS[self.case],
            u_max=1.5 * self.lattice_u_mean, inflow="parabolic", dtype=dtype,
            obstacle=Obstacle(shape="circle", cx=centre, cy=centre, size=float(n)),
        )

    @property
    def dt(self) -> float:
        """Seconds per lattice step."""
        return DIAMETER / self.cells_per_diameter * self.lattice_u_mean / (U_PEAK[self.case] / 1.5)

    def pressure_stencil(self) -> tuple[np.ndarray, np.ndarray]:
        """Nodes (k, 2) and weights (2, k): row 0 gives the lattice density at the cylinder's front point,
        row 1 at its back point, each linearly extrapolated from bilinear interpolants one and two
        cells away from the surface along the axis."""
        n = self.cells_per_diameter
        c, r = 0.5 + CENTRE / DIAMETER * n, 0.5 * n
        weights: dict[tuple[int, int], np.ndarray] = {}
        for row, (xs, step) in enumerate(((c - r, -1.0), (c + r, 1.0))):
            for dist, factor in ((1.0, 2.0), (2.0, -1.0)):
                x, y = xs + step * dist, c
                x0, y0 = int(np.floor(x)), int(np.floor(y))
                fx, fy = x - x0, y - y0
                for (yy, xx), w in (((y0, x0), (1 - fx) * (1 - fy)), ((y0, x0 + 1), fx * (1 - fy)),
                                    ((y0 + 1, x0), (1 - fx) * fy), ((y0 + 1, x0 + 1), fx * fy)):
                    weights.setdefault((yy, xx), np.zeros(2))[row] += factor * w
        nodes = np.array(list(weights), dtype=np.int64)
        return nodes, np.stack([weights[tuple(k)] for k in nodes], axis=1)


@dataclass
class History:
    """Per-step signals of a run, in the benchmark's units."""

    time: np.ndarray  # s
    cd: np.ndarray
    cl: np.ndarray
    dp: np.ndarray  # Pa (density 1)


def _coefficients(setup: Setup, forces: np.ndarray, rho: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, ...]:
    u, n = setup.lattice_u_mean, setup.cells_per_diameter
    scale = 2.0 / (u * u * n)
    density = rho @ weights.T  # (steps, 2): front, back
    dp_lattice = CS2 * (density[:, 0] - density[:, 1])
    return forces[:, 0] * scale, forces[:, 1] * scale, dp_lattice * (U_PEAK[setup.case] / 1.5 / u) ** 2


def periods(signal: np.ndarray) -> np.ndarray:
    """Indices (fractional) of the upward crossings of a signal's mean over its second half."""
    s = signal - signal[len(signal) // 2 :].mean()
    i = np.nonzero((s[:-1] < 0) & (s[1:] >= 0))[0]
    return i + s[i] / (s[i] - s[i + 1])


def last_period(cl: np.ndarray) -> tuple[np.ndarray, int, int]:
    """The lift's upward crossings and the step range [start, end) of its last full period."""
    up = periods(cl)
    if len(up) < 2:
        return up, 0, 0
    return up, int(np.ceil(up[-2])), int(np.floor(up[-1]))


def analyse(setup: Setup, history: History, window: int) -> dict:
    """The benchmark's quantities from a run's history: 2D-1 averages over the last ``window`` steps
    (the residual sound of the channel swings them slightly), 2D-2 reads the last full lift period."""
    if setup.case == "2D-1":
        return {k: float(getattr(history, k)[-window:].mean()) for k in ("cd", "cl", "dp")}
    up, start, end = last_period(history.cl)
    if len(up) < 3:
        raise RuntimeError("no periodic vortex shedding developed: fewer than 3 lift periods recorded")
    period = (up[-1] - up[-2]) * setup.dt
    peak = start + int(np.argmax(history.cl[start:end]))
    half = history.time[peak] + 0.5 * period
    return {
        "cd_max": float(history.cd[start:end].max()),
        "cl_max": float(history.cl[start:end].max()),
        "st": float(DIAMETER / period / (U_PEAK[setup.case] / 1.5)),
        "dp": float(np.interp(half, history.time, history.dp)),
    }


def ramp_steps(config: FlowConfig) -> int:
    """Steps over which the inflow ramps up from rest: two periods of the channel's slowest acoustic
    mode (a quarter wave between the reflecting inlet and the outlet, 4 L / c_s), so that the start
    leaves no sound ringing in the channel."""
    return int(2 * 4 * config.nx / np.sqrt(CS2))


def run(setup: Setup, backend: str = "numba", dtype: str = "float64", max_time: float | None = None,
        tolerance: float = 1e-4, progress: Callable[[str], None] | None = None, device: str = "cpu") -> tuple[dict, History, dict]:
    """Start from rest, ramp the inflow up (sin^2 over ``ramp_steps``), then simulate until the
    benchmark's quantities settle (2D-1: the mean c_D of two consecutive windows of ``ramp_steps``
    differs by less than ``tolerance`` relative; 2D-2: c_D,max and c_L,max of consecutive lift periods
    agree within ``tolerance``) or ``max_time`` seconds of flow have passed.
    Returns (quantities, history, stats)."""
    max_time = max_time if max_time is not None else (60.0 if setup.case == "2D-1" else 20.0)
    config = setup.config(dtype)
    solver = ChannelSolver(config, backend=backend, at_rest=True, device=device)
    probes, weights = setup.pressure_stencil()
    series: list[tuple[np.ndarray, ...]] = []

    def advance(steps: int) -> None:
        forces, rho = solver.advance(steps, probes)
        series.append(_coefficients(setup, forces, rho, weights))

    def history() -> History:
        return History(np.arange(1, solver.time + 1) * setup.dt, *(np.concatenate(s) for s in zip(*series)))

    t0 = time.perf_counter()
    ramp, every = ramp_steps(config), 20
    for k in range(0, ramp, every):
        solver.set_inflow_scale(np.sin(0.5 * np.pi * (k + 0.5 * every) / ramp) ** 2)
        advance(min(every, ramp - k))
    solver.set_inflow_scale(1.0)
    chunk = ramp if setup.case == "2D-1" else max(1, int(round(1 / 3 / setup.dt)))  # a window, or a period
    max_steps = max(int(max_time / setup.dt), ramp + chunk)
    converged, previous = False, None
    while solver.time < max_steps:
        advance(min(chunk, max_steps - solver.time))
        current = _settled_quantities(setup, history(), ramp)
        if progress:
            progress(f"{setup.case} N={setup.cells_per_diameter}: t = {solver.time * setup.dt:.2f} s, {current}")
        if current is not None and previous is not None and all(
            abs(current[k] - previous[k]) <= tolerance * abs(previous[k]) for k in current
        ):
            converged = True
            break
        previous = current
    wall = time.perf_counter() - t0
    stats = {
        "cells_per_diameter": setup.cells_per_diameter, "wall_s": wall, "steps": solver.time,
        "mlups": config.nx * config.ny * solver.time / wall / 1e6, "converged": converged,
        "flow_time_s": solver.time * setup.dt, "nx": config.nx, "ny": config.ny, "tau": config.tau,
        "lattice_u_mean": setup.lattice_u_mean, "backend": backend, "dtype": dtype, "device": device,
    }
    final = history()
    return analyse(setup, final, ramp), final, stats


def _settled_quantities(setup: Setup, history: History, window: int) -> dict | None:
    """The quantities that must stop changing: the window mean of c_D (2D-1), or c_D,max and c_L,max
    of the last lift period (2D-2)."""
    if setup.case == "2D-1":
        return {"cd": float(history.cd[-window:].mean())}
    up, start, end = last_period(history.cl)
    if len(up) < 4 or history.cl[int(up[-2]) :].max() < 0.1:
        return None
    return {"cd_max": float(history.cd[start:end].max()), "cl_max": float(history.cl[start:end].max())}
