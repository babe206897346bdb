"""Reference backend in plain NumPy: the step as separate, composed operators.

    stream -> obstacle bounce-back (+ force) -> collide -> hold the solids -> fill the ghost nodes

The fused kernels (numba, torch) must agree with it to float tolerance.
"""

import numpy as np

from models.karman.solver.collision import trt_collide
from models.karman.solver.lattice import CX, CY, OPP, W
from models.karman.solver.operators import INLET_DIRS, OUTLET_DIRS, StepPlan


def stream(fpost: np.ndarray, walls: bool) -> np.ndarray:
    """Pull streaming (periodic at the array edges); with ``walls`` the populations that would come from
    the wall rows bounce back half-way instead."""
    f = np.empty_like(fpost)
    for i in range(9):
        f[i] = np.roll(fpost[i], (CY[i], CX[i]), axis=(0, 1))
    if walls:
        for i in range(9):
            if CY[i] == 1:
                f[i, 1] = fpost[OPP[i], 1]
            elif CY[i] == -1:
                f[i, -2] = fpost[OPP[i], -2]
    return f


def obstacle_bounce(f: np.ndarray, fpost: np.ndarray, plan: StepPlan) -> tuple[float, float]:
    """Interpolated bounce-back of the populations arriving from the obstacle; returns the force on it
    by momentum exchange."""
    ys, xs = plan.cells[:, 0], plan.cells[:, 1]
    fx = fy = 0.0
    for i in range(1, 9):
        hit = plan.kind[:, i] == 2
        if not hit.any():
            continue
        y, x, (a, b, c) = ys[hit], xs[hit], plan.coef[hit, i].T
        o = OPP[i]
        new = a * fpost[o, y, x] + b * fpost[o, y + CY[i], x + CX[i]] + c * fpost[i, y, x]
        f[i, y, x] = new
        exchanged = fpost[o, y, x] + new
        fx -= CX[i] * exchanged.sum()
        fy -= CY[i] * exchanged.sum()
    return float(fx), float(fy)


def fill_ghosts(fnew: np.ndarray, fpost: np.ndarray, plan: StepPlan) -> None:
    """Channel: velocity bounce-back at the inlet (at rest density, so the inflowing mass is fixed); at
    the outlet a convective (non-reflecting) outflow whose incoming populations also carry
    ``outlet_anchor`` w_i times the outlet column's mean density deficit, which holds the mean pressure
    at rho = 1 (the convective condition alone lets it drift).
    Periodic: the outer ring of nodes copies the opposite side of the interior."""
    if plan.periodic:
        wrap_periodic(fnew)
        return
    ny = fnew.shape[1]
    for k, i in enumerate(INLET_DIRS):
        ys = np.arange(max(1, 1 - CY[i]), min(ny - 1, ny - 1 - CY[i]))
        fnew[i, ys, 0] = fnew[OPP[i], ys + CY[i], 1] + 6.0 * W[i] * CX[i] * plan.inlet_u[k, ys]
    u = plan.u_convect
    drift = 1.0 - fnew[:, 1:-1, -2].sum(axis=0).mean()  # of the outlet column's mean density from 1
    for i in OUTLET_DIRS:
        fnew[i, 1:-1, -1] = (fpost[i, 1:-1, -1] + u * fnew[i, 1:-1, -2]) / (1.0 + u) + W[i] * plan.outlet_anchor * drift


def wrap_periodic(f: np.ndarray) -> None:
    """Copy the interior's edges into the opposite ghost ring (columns first, then whole rows, so the
    corners get the opposite corner)."""
    f[:, :, 0], f[:, :, -1] = f[:, :, -2], f[:, :, 1]
    f[:, 0, :], f[:, -1, :] = f[:, -2, :], f[:, 1, :]


def step(fpost: np.ndarray, plan: StepPlan) -> tuple[np.ndarray, tuple[float, float]]:
    """One time step on post-collision populations (9, ny, nx): the next state and the obstacle force."""
    f = stream(fpost, walls=not plan.periodic)
    force = obstacle_bounce(f, fpost, plan)
    collided = trt_collide(f, plan.omega_plus, plan.omega_minus)
    fnew = fpost.copy()
    fnew[:, 1:-1, 1:-1] = collided[:, 1:-1, 1:-1]
    fnew[:, plan.solid[:, 0], plan.solid[:, 1]] = W.astype(fnew.dtype)[:, None]
    fill_ghosts(fnew, fpost, plan)
    return fnew, force
