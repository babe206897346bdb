"""Physical and numerical set-up of one channel-flow simulation, validated before any step."""

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from models.karman.solver.collision import trt_rates
from models.karman.solver.geometry import Obstacle

# Stable ranges of the scheme (lattice units), from sweeps of circles, squares and rectangles 12-32 cells
# across at u_max 0.05-0.17 in channels four obstacle sizes high (15 000 steps each). Two bounds: the
# relaxation time must exceed 0.5 + TAU_U2 u_max^2 (at smaller tau the fastest flows diverged), and the
# grid Reynolds number u_max / nu, which equals 1.5 Re / size for a parabolic inflow, must stay at or
# under GRID_RE_MAX (beyond it the wake is under-resolved and diverged for every shape). Inside them,
# squares and rectangles 24 cells and more across still diverged at the edge; such a run stops with a
# clear error (ChannelSolver.advance) instead of storing NaNs.
TAU_U2, TAU_MAX = 2.0, 2.0
GRID_RE_MAX = 15.0
MACH_MAX = 0.3
MIN_CELLS = 8

SOLVER_VERSION = "lbm-d2q9-trt-2"
DTYPES: tuple[str, ...] = ("float32", "float64")  # population precisions


@dataclass(frozen=True)
class FlowConfig:
    """A channel of ``ny`` × ``nx`` lattice cells, walls top and bottom, flow from left to right.

    The Reynolds number is based on the mean inflow velocity and the obstacle's cross-stream size.
    """

    nx: int = 128
    ny: int = 64
    reynolds: float = 100.0
    u_max: float = 0.1
    inflow: Literal["parabolic", "uniform"] = "parabolic"
    obstacle: Obstacle = field(default_factory=Obstacle)
    dtype: Literal["float32", "float64"] = "float32"
    wall: Literal["interpolated", "halfway"] = "interpolated"
    magic: float | None = None  # TRT magic parameter; None = 3/16 with tau- capped (see collision)

    @property
    def u_mean(self) -> float:
        """Mean inflow velocity (lattice units), the velocity scale of Re."""
        return (2.0 / 3.0) * self.u_max if self.inflow == "parabolic" else self.u_max

    @property
    def viscosity(self) -> float:
        return self.u_mean * self.obstacle.size / self.reynolds

    @property
    def tau(self) -> float:
        return 3.0 * self.viscosity + 0.5

    @property
    def mach(self) -> float:
        return self.u_max * np.sqrt(3.0)

    def validate(self) -> "FlowConfig":
        """Raise ValueError naming the offending value and its allowed range; return self."""
        if self.nx < MIN_CELLS or self.ny < MIN_CELLS:
            raise ValueError(f"grid {self.nx}x{self.ny} is too small; nx and ny must be >= {MIN_CELLS}")
        if not self.reynolds > 0:
            raise ValueError(f"Reynolds number {self.reynolds:g} must be > 0")
        if not 0 < self.u_max:
            raise ValueError(f"inflow velocity u_max {self.u_max:g} must be > 0 (lattice units)")
        if self.mach > MACH_MAX:
            raise ValueError(
                f"Mach number {self.mach:.3f} (u_max {self.u_max:g}) exceeds {MACH_MAX}; "
                f"use u_max <= {MACH_MAX / np.sqrt(3):.3f}"
            )
        if self.inflow not in ("parabolic", "uniform"):
            raise ValueError(f"unknown inflow {self.inflow!r}; choose parabolic or uniform")
        if self.wall not in ("interpolated", "halfway"):
            raise ValueError(f"unknown obstacle wall treatment {self.wall!r}; choose interpolated or halfway")
        if self.magic is not None and not 0 < self.magic <= 1:
            raise ValueError(f"TRT magic parameter {self.magic:g} must lie in (0, 1]")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        self.obstacle.check_fits(self.ny, self.nx)
        tau_min = 0.5 + TAU_U2 * self.u_max**2
        if not tau_min - 1e-12 <= self.tau <= TAU_MAX:
            raise ValueError(
                f"relaxation time tau {self.tau:.4f} (Re {self.reynolds:g}, u_max {self.u_max:g}, "
                f"size {self.obstacle.size:g} cells) is outside the stable range {tau_min:.4f}..{TAU_MAX} "
                f"(the minimum is 0.5 + {TAU_U2:g} u_max^2); lower Re or u_max, or raise the resolution"
            )
        grid_re = self.u_max / self.viscosity
        if grid_re > GRID_RE_MAX * (1 + 1e-12):
            need = self.obstacle.size * grid_re / GRID_RE_MAX
            raise ValueError(
                f"grid Reynolds number u_max/nu {grid_re:.1f} (Re {self.reynolds:g} at {self.obstacle.size:g} cells across) "
                f"is outside the stable range 0..{GRID_RE_MAX:g}; use at least {need:.1f} cells across the obstacle or a lower Re"
            )
        return self

    def inflow_velocity(self, y: np.ndarray) -> np.ndarray:
        """Streamwise inflow velocity at heights ``y`` (node coordinates); zero outside the walls,
        which sit half-way at y = 0.5 and y = ny - 1.5."""
        s = (np.asarray(y, dtype=np.float64) - 0.5) / (self.ny - 2.0)
        inside = (s > 0) & (s < 1)
        u = 4.0 * self.u_max * s * (1.0 - s) if self.inflow == "parabolic" else np.full_like(s, self.u_max)
        return np.where(inside, u, 0.0)

    def inflow_profile(self) -> np.ndarray:
        """Streamwise inflow velocity per row (ny,); zero in the wall rows."""
        return self.inflow_velocity(np.arange(self.ny, dtype=np.float64))

    def attrs(self) -> dict:
        """Every physical and numerical parameter, flat, for dataset attributes and run params."""
        ob = self.obstacle
        return {
            "nx": self.nx,
            "ny": self.ny,
            "reynolds": float(self.reynolds),
            "u_max": float(self.u_max),
            "u_mean": float(self.u_mean),
            "inflow": self.inflow,
            "viscosity": float(self.viscosity),
            "tau": float(self.tau),
            "mach": float(self.mach),
            "dtype": self.dtype,
            "obstacle_shape": ob.shape,
            "obstacle_cx": float(ob.cx),
            "obstacle_cy": float(ob.cy),
            "obstacle_size": float(ob.size),
            "obstacle_aspect": float(ob.aspect),
            "collision": "trt",
            "trt_tau_minus": 1.0 / trt_rates(self.tau, self.magic)[1],
            "obstacle_wall": self.wall,
            "outflow": "convective",
            "solver_version": SOLVER_VERSION,
            "units": "lattice: dx = dt = 1, rho0 = 1",
        }
