"""Reference backend in plain NumPy: streaming with its link closures, then collision, as separate
operators. The fused numba kernel must agree with it to float tolerance."""

import numpy as np

from models.solver.collision import equilibrium, moments, trt_collide
from models.solver.lattice import CX, CY, FLUID, INLET, OPP, OUTLET, SOLID, W


def stream(fpost: np.ndarray, nodes: np.ndarray, u_in: np.ndarray) -> np.ndarray:
    """Pull streaming (periodic at the array edges) with links to non-fluid nodes closed locally:
    half-way bounce-back at solids, moving-wall bounce-back at the inlet velocity, anti-bounce-back
    at rho = 1 at the outlet."""
    rho, ux, uy = moments(fpost)
    usq = ux * ux + uy * uy
    f = np.empty_like(fpost)
    for i in range(9):
        shift = (CY[i], CX[i])
        source = np.roll(nodes, shift, axis=(0, 1))
        own_opp = fpost[OPP[i]]
        u_wall = 0.5 * (u_in + np.roll(u_in, CY[i]))[:, None]
        cu = CX[i] * ux + CY[i] * uy
        f[i] = np.select(
            [source == FLUID, source == SOLID, source == INLET, source == OUTLET],
            [
                np.roll(fpost[i], shift, axis=(0, 1)),
                own_opp,
                own_opp + 6.0 * W[i] * rho * CX[i] * u_wall,
                -own_opp + 2.0 * W[i] * (1.0 + 4.5 * cu * cu - 1.5 * usq),
            ],
        )
    return f


def boundary_nodes(fnew: np.ndarray, fpost: np.ndarray, nodes: np.ndarray, u_in: np.ndarray) -> None:
    """Non-fluid nodes hold display values: zero in solids, the inflow equilibrium at the inlet, the
    upstream column's previous state at the outlet."""
    ones = np.ones(nodes.shape)
    inflow = equilibrium(ones, u_in[:, None] * ones, 0 * ones)
    fnew[:] = np.where(nodes == INLET, inflow, fnew)
    fnew[:] = np.where(nodes == OUTLET, np.roll(fpost, 1, axis=2), fnew)
    fnew[:, nodes == SOLID] = 0


def step(fpost: np.ndarray, nodes: np.ndarray, u_in: np.ndarray, omega_plus: float, omega_minus: float) -> np.ndarray:
    """One time step on post-collision populations (9, ny, nx); returns the next post-collision state."""
    f = stream(fpost, nodes, u_in)
    fnew = trt_collide(f, omega_plus, omega_minus)
    boundary_nodes(fnew, fpost, nodes, u_in)
    return fnew.astype(fpost.dtype)
