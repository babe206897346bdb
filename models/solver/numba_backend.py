"""Fused CPU backend: one numba kernel per time step does streaming, boundaries and TRT collision.

Each fluid cell pulls its populations from its neighbours' post-collision values, collides and
writes its own post-collision populations, in one pass over memory. Links to non-fluid nodes are
closed locally: half-way bounce-back at solids, moving-wall bounce-back at the velocity inlet,
anti-bounce-back at the pressure outlet (walls half-way between nodes).
Rows run in parallel over the cores. Semantics match ``numpy_backend.step``.
"""

import numba

from models.solver.lattice import CX, CY, FLUID, INLET, OPP, OUTLET, SOLID, W

_CX = tuple(int(c) for c in CX)
_CY = tuple(int(c) for c in CY)
_OPP = tuple(int(o) for o in OPP)
_W = tuple(float(w) for w in W)


@numba.njit(inline="always")
def _local_moments(fpost, y, x):
    rho = fpost[0, y, x]
    for i in range(1, 9):
        rho += fpost[i, y, x]
    ux = (fpost[1, y, x] - fpost[3, y, x] + fpost[5, y, x] - fpost[6, y, x] - fpost[7, y, x] + fpost[8, y, x]) / rho
    uy = (fpost[2, y, x] - fpost[4, y, x] + fpost[5, y, x] + fpost[6, y, x] - fpost[7, y, x] - fpost[8, y, x]) / rho
    return rho, ux, uy


@numba.njit(inline="always")
def _pull(fpost, nodes, u_in, i, y, x, ny, nx):
    # Population i arriving at (y, x) from its source cell (periodic at the array edges).
    sx = x - _CX[i]
    sy = y - _CY[i]
    if sx < 0:
        sx += nx
    elif sx >= nx:
        sx -= nx
    if sy < 0:
        sy += ny
    elif sy >= ny:
        sy -= ny
    t = nodes[sy, sx]
    if t == FLUID:
        return fpost[i, sy, sx]
    o = _OPP[i]
    if t == SOLID:  # half-way bounce-back
        return fpost[o, y, x]
    rho, ux, uy = _local_moments(fpost, y, x)
    if t == INLET:  # moving-wall bounce-back at the inlet velocity (mid-link average)
        uw = 0.5 * (u_in[y] + u_in[sy])
        return fpost[o, y, x] + 6.0 * _W[i] * rho * _CX[i] * uw
    # OUTLET: anti-bounce-back at rho = 1 with the cell's own velocity
    cu = _CX[i] * ux + _CY[i] * uy
    return -fpost[o, y, x] + 2.0 * _W[i] * (1.0 + 4.5 * cu * cu - 1.5 * (ux * ux + uy * uy))


@numba.njit(parallel=True, cache=True, fastmath=True)
def step_kernel(fpost, fnew, nodes, u_in, omega_plus, omega_minus):
    """Advance post-collision populations ``fpost`` (9, ny, nx) by one step into ``fnew``."""
    ny, nx = nodes.shape
    one = fpost.dtype.type(1.0)
    wp = fpost.dtype.type(omega_plus)
    wm = fpost.dtype.type(omega_minus)
    w0, ws, wd = fpost.dtype.type(4.0 / 9.0), fpost.dtype.type(1.0 / 9.0), fpost.dtype.type(1.0 / 36.0)
    half = fpost.dtype.type(0.5)
    for y in numba.prange(ny):
        for x in range(nx):
            t = nodes[y, x]
            if t != FLUID:
                # Solid, inlet and outlet nodes are not simulated; they hold the boundary's equilibrium
                # (zero in solids) so that snapshots show sensible values there.
                ub = u_in[y] if t == INLET else 0.0
                rho_b = 0.0 if t == SOLID else 1.0
                if t == OUTLET:
                    xp = x - 1 if x > 0 else nx - 1
                    for i in range(9):
                        fnew[i, y, x] = fpost[i, y, xp]
                    continue
                for i in range(9):
                    cu = _CX[i] * ub
                    fnew[i, y, x] = _W[i] * rho_b * (1.0 + 3 * cu + 4.5 * cu * cu - 1.5 * ub * ub)
                continue
            f0 = _pull(fpost, nodes, u_in, 0, y, x, ny, nx)
            f1 = _pull(fpost, nodes, u_in, 1, y, x, ny, nx)
            f2 = _pull(fpost, nodes, u_in, 2, y, x, ny, nx)
            f3 = _pull(fpost, nodes, u_in, 3, y, x, ny, nx)
            f4 = _pull(fpost, nodes, u_in, 4, y, x, ny, nx)
            f5 = _pull(fpost, nodes, u_in, 5, y, x, ny, nx)
            f6 = _pull(fpost, nodes, u_in, 6, y, x, ny, nx)
            f7 = _pull(fpost, nodes, u_in, 7, y, x, ny, nx)
            f8 = _pull(fpost, nodes, u_in, 8, y, x, ny, nx)
            rho = f0 + f1 + f2 + f3 + f4 + f5 + f6 + f7 + f8
            ux = (f1 - f3 + f5 - f6 - f7 + f8) / rho
            uy = (f2 - f4 + f5 + f6 - f7 - f8) / rho
            usq = 1.5 * (ux * ux + uy * uy)
            # rest population: symmetric part only
            fnew[0, y, x] = f0 - wp * (f0 - w0 * rho * (one - usq))
            # pairs (i, opp): symmetric and antisymmetric parts relax at their own rates
            for i, fi, fo, cu, wi in (
                (1, f1, f3, ux, ws),
                (2, f2, f4, uy, ws),
                (5, f5, f7, ux + uy, wd),
                (6, f6, f8, uy - ux, wd),
            ):
                eq_sym = wi * rho * (one + 4.5 * cu * cu - usq)
                eq_anti = wi * rho * 3 * cu
                sym = half * (fi + fo) - eq_sym
                anti = half * (fi - fo) - eq_anti
                fnew[i, y, x] = fi - wp * sym - wm * anti
                fnew[_OPP[i], y, x] = fo - wp * sym + wm * anti
