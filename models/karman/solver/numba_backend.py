"""Fused CPU backend in numba: the operators of ``models.karman.solver.operators`` in a few passes over memory.

Layout: the nine population planes live in one (9, P) buffer, plane i of node (y, x) at [i, y * nx + x].
P exceeds ny * nx by a pad that staggers the planes across cache sets: with power-of-two lattices the
eighteen streams of a step (nine read, nine written) would otherwise all fall into the same sets of the
L1/L2 caches and evict each other, which halved the throughput here.

* ``bulk``: every interior node pulls its nine populations, collides (TRT) and writes them, rows in
  parallel over the cores. The wall rows' bounce-back is chosen once per row, so the inner loop
  (``_row``) is branch-free with unit stride and vectorises; it moves 2 x 9 values per node and is the
  whole cost at scale.
* ``obstacle``: the few nodes next to the obstacle are redone with interpolated bounce-back, and the
  force on the obstacle is summed (momentum exchange).
* ``finish``: the obstacle interior is held at rest and the ghost columns are filled.

``advance`` runs many steps in one call and records forces and density probes on the way.
Semantics match ``numpy_backend.step``; tests hold them equal.
"""

import numba
import numpy as np
from numba.core.compiler import Compiler

from models.karman.solver.lattice import CX, CY, OPP, W
from models.karman.solver.operators import INLET_DIRS as _INLET
from models.karman.solver.operators import OUTLET_DIRS as _OUTLET

_CX = tuple(int(c) for c in CX)
_CY = tuple(int(c) for c in CY)
_OPP = tuple(int(o) for o in OPP)
_W = tuple(float(w) for w in W)
_STAGGER = 112  # floats (448 bytes, about 4096 / 9): the offset between consecutive planes' cache sets
_SET_SPAN = 1024  # floats (4096 bytes): the address span that maps onto all sets of the L1 cache


def plane_size(ny: int, nx: int) -> int:
    """Padded plane length P for a lattice of ny x nx nodes."""
    n = ny * nx
    return n + (_STAGGER - n % _SET_SPAN) % _SET_SPAN


def to_planes(f: np.ndarray) -> np.ndarray:
    """(9, ny, nx) populations -> the padded (9, P) layout (pad zeroed)."""
    _, ny, nx = f.shape
    out = np.zeros((9, plane_size(ny, nx)), dtype=f.dtype)
    out[:, : ny * nx] = f.reshape(9, ny * nx)
    return out


def from_planes(buf: np.ndarray, ny: int, nx: int) -> np.ndarray:
    """The padded layout -> a (9, ny, nx) copy."""
    return buf[:, : ny * nx].reshape(9, ny, nx).copy()


class _NoAlias(Compiler):
    """Compiles with its array arguments marked non-aliasing (numba's ``noalias`` flag), so LLVM
    vectorises ``_row`` without run-time overlap checks. Only ``_row`` uses it; its callers pass nine
    read-only source segments and nine distinct destination segments."""

    def define_pipelines(self):
        self.state.flags.noalias = True
        return super().define_pipelines()


@numba.njit(inline="always", fastmath=True, error_model="numpy")
def _collide(f0, f1, f2, f3, f4, f5, f6, f7, f8, hp, hm):
    """TRT collision of one node; returns the nine post-collision values. ``hp``, ``hm`` are half the
    symmetric and antisymmetric rates. Constants take the populations' dtype, so a float32 state is
    computed in float32 throughout."""
    T = type(f0)
    rho = f0 + f1 + f2 + f3 + f4 + f5 + f6 + f7 + f8
    inv = T(1.0) / rho
    ux = (f1 - f3 + f5 - f6 - f7 + f8) * inv
    uy = (f2 - f4 + f5 + f6 - f7 - f8) * inv
    base = T(1.0) - T(1.5) * (ux * ux + uy * uy)
    rs, rd = rho * T(1.0 / 9.0), rho * T(1.0 / 36.0)
    g0 = f0 - (hp + hp) * (f0 - rho * T(4.0 / 9.0) * base)
    # For each pair (i, opposite): ep, em are the equilibrium's symmetric and antisymmetric parts
    # (w rho (1 + 4.5 cu^2 - 1.5 u^2) and w rho 3 cu); g = f - wp (f+ - ep) -/+ wm (f- - em).
    cu = ux
    ep, em = rs * (base + T(4.5) * cu * cu), rs * T(3.0) * cu
    p, m = hp * (f1 + f3 - ep - ep), hm * (f1 - f3 - em - em)
    g1, g3 = f1 - p - m, f3 - p + m
    cu = uy
    ep, em = rs * (base + T(4.5) * cu * cu), rs * T(3.0) * cu
    p, m = hp * (f2 + f4 - ep - ep), hm * (f2 - f4 - em - em)
    g2, g4 = f2 - p - m, f4 - p + m
    cu = ux + uy
    ep, em = rd * (base + T(4.5) * cu * cu), rd * T(3.0) * cu
    p, m = hp * (f5 + f7 - ep - ep), hm * (f5 - f7 - em - em)
    g5, g7 = f5 - p - m, f7 - p + m
    cu = uy - ux
    ep, em = rd * (base + T(4.5) * cu * cu), rd * T(3.0) * cu
    p, m = hp * (f6 + f8 - ep - ep), hm * (f6 - f8 - em - em)
    g6, g8 = f6 - p - m, f8 - p + m
    return g0, g1, g2, g3, g4, g5, g6, g7, g8


@numba.njit(fastmath=True, error_model="numpy", pipeline_class=_NoAlias, cache=True)
def _row(a0, a1, a2, a3, a4, a5, a6, a7, a8, b0, b1, b2, b3, b4, b5, b6, b7, b8, hp, hm):
    # a_i: the segment population i is pulled from; b_i: where its post-collision value goes.
    for x in range(a0.shape[0]):
        g = _collide(a0[x], a1[x], a2[x], a3[x], a4[x], a5[x], a6[x], a7[x], a8[x], hp, hm)
        b0[x], b1[x], b2[x], b3[x], b4[x], b5[x], b6[x], b7[x], b8[x] = g


@numba.njit(parallel=True, fastmath=True, error_model="numpy", cache=True)
def bulk(fpost, fnew, ny, nx, hp, hm, walls):
    """Stream and collide every interior node (rows 1..ny-2, columns 1..nx-2) of padded planes."""
    for y in numba.prange(1, ny - 1):
        c, s, n = y * nx + 1, (y - 1) * nx + 1, (y + 1) * nx + 1  # column 1 of rows y, y-1, y+1
        e = nx - 2
        # Northbound populations (2, 5, 6) come from row y-1, or bounce back off the bottom wall;
        # southbound ones (4, 7, 8) from row y+1, or off the top wall.
        if walls and y == 1:
            a2, a5, a6 = fpost[4, c : c + e], fpost[7, c : c + e], fpost[8, c : c + e]
        else:
            a2, a5, a6 = fpost[2, s : s + e], fpost[5, s - 1 : s - 1 + e], fpost[6, s + 1 : s + 1 + e]
        if walls and y == ny - 2:
            a4, a7, a8 = fpost[2, c : c + e], fpost[5, c : c + e], fpost[6, c : c + e]
        else:
            a4, a7, a8 = fpost[4, n : n + e], fpost[7, n + 1 : n + 1 + e], fpost[8, n - 1 : n - 1 + e]
        _row(
            fpost[0, c : c + e], fpost[1, c - 1 : c - 1 + e], a2, fpost[3, c + 1 : c + 1 + e], a4, a5, a6, a7, a8,
            fnew[0, c : c + e], fnew[1, c : c + e], fnew[2, c : c + e], fnew[3, c : c + e], fnew[4, c : c + e],
            fnew[5, c : c + e], fnew[6, c : c + e], fnew[7, c : c + e], fnew[8, c : c + e], hp, hm,
        )


@numba.njit(fastmath=True, error_model="numpy", cache=True)
def obstacle(fpost, fnew, nx, cells, kind, coef, hp, hm):
    """Redo the nodes next to the obstacle with its bounce-back; return the force (fx, fy) on it."""
    fx = 0.0
    fy = 0.0
    f = np.empty(9, dtype=fpost.dtype)
    for b in range(cells.shape[0]):
        y, x = cells[b, 0], cells[b, 1]
        k = y * nx + x
        for i in range(9):
            o = _OPP[i]
            if kind[b, i] == 0:
                f[i] = fpost[i, k - _CY[i] * nx - _CX[i]]
            elif kind[b, i] == 1:
                f[i] = fpost[o, k]
            else:
                v = (coef[b, i, 0] * fpost[o, k] + coef[b, i, 1] * fpost[o, k + _CY[i] * nx + _CX[i]]
                     + coef[b, i, 2] * fpost[i, k])
                f[i] = v
                ex = fpost[o, k] + v
                fx -= _CX[i] * ex
                fy -= _CY[i] * ex
        g = _collide(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], hp, hm)
        for i in range(9):
            fnew[i, k] = g[i]
    return fx, fy


@numba.njit(cache=True)
def finish(fpost, fnew, ny, nx, solid, periodic, inlet_u, u_convect, anchor):
    """Hold the obstacle interior at rest and fill the ghost nodes (see numpy_backend.fill_ghosts)."""
    for s in range(solid.shape[0]):
        for i in range(9):
            fnew[i, solid[s, 0] * nx + solid[s, 1]] = _W[i]
    if periodic:
        for i in range(9):
            for y in range(ny):
                fnew[i, y * nx] = fnew[i, y * nx + nx - 2]
                fnew[i, y * nx + nx - 1] = fnew[i, y * nx + 1]
            for x in range(nx):
                fnew[i, x] = fnew[i, (ny - 2) * nx + x]
                fnew[i, (ny - 1) * nx + x] = fnew[i, nx + x]
        return
    for k in range(3):
        i = _INLET[k]
        for ys in range(max(1, 1 - _CY[i]), min(ny - 1, ny - 1 - _CY[i])):
            t = (ys + _CY[i]) * nx + 1
            fnew[i, ys * nx] = fnew[_OPP[i], t] + 6.0 * _W[i] * _CX[i] * inlet_u[k, ys]
    mass = 0.0
    for y in range(1, ny - 1):
        for j in range(9):
            mass += fnew[j, y * nx + nx - 2]
    drift = 1.0 - mass / (ny - 2)
    for i in _OUTLET:
        for y in range(1, ny - 1):
            g = y * nx + nx - 1
            fnew[i, g] = (fpost[i, g] + u_convect * fnew[i, g - 1]) / (1.0 + u_convect) + _W[i] * anchor * drift


@numba.njit(cache=True)
def advance(fa, fb, ny, nx, steps, wp, wm, periodic, cells, kind, coef, solid, inlet_u, u_convect, anchor,
            forces, probes, probe_rho):
    """Run ``steps`` steps from padded planes ``fa``, using ``fb`` as the other buffer; record the
    obstacle force per step in ``forces`` (steps, 2) and the density at the ``probes`` nodes in
    ``probe_rho`` (steps, np). Returns True when the final state is in ``fb``."""
    hp = fa.dtype.type(0.5 * wp)
    hm = fa.dtype.type(0.5 * wm)
    for t in range(steps):
        bulk(fa, fb, ny, nx, hp, hm, not periodic)
        fx, fy = obstacle(fa, fb, nx, cells, kind, coef, hp, hm)
        finish(fa, fb, ny, nx, solid, periodic, inlet_u, u_convect, anchor)
        forces[t, 0] = fx
        forces[t, 1] = fy
        for p in range(probes.shape[0]):
            k = probes[p, 0] * nx + probes[p, 1]
            r = 0.0
            for i in range(9):
                r += fb[i, k]
            probe_rho[t, p] = r
        fa, fb = fb, fa
    return steps % 2 == 1
