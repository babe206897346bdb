"""Fused GPU backend in Triton: the whole production step of many simulations in one kernel launch per step.

One launch advances a batch of B simulations of the same lattice (each its own geometry, rates and inflow):
every program takes a run of cells along x in one row of one simulation, pulls its nine populations from the
other buffer (x contiguous), collides them (TRT) and writes them back; nothing else touches memory.

* **Layout**: populations (B, 9, ny, nx), x contiguous; a one-byte cell flag (B, ny, nx) says fluid, obstacle
  interior or "next to the obstacle", and only there is the row of the obstacle's link table read (its
  Bouzidi kinds and coefficients). Offsets between simulations are 64-bit.
* **Boundaries inside the step**: the wall rows bounce back by choosing the source address; the inlet's
  velocity bounce-back is folded into the pull (the ghost value is the cell's own opposite population plus
  the inflow term); the outlet's convective condition is a recursive filter whose state is the ghost column,
  kept one step behind and advanced by the cells beside it, with the outlet's mean density summed by atomics
  in the step before. ``state()`` rebuilds the ghost nodes as the reference holds them, so the backend equals
  ``numpy_backend.step`` (the first step after a state is set reads that state's ghost nodes as given).
* **Storage**: float32 or float64. Populations stored in fp16 around their rest equilibrium (FluidX3D's FP16S)
  were tried and dropped: on an H100 they were 1.14x faster at 4096x1024 but missed Schäfer–Turek by far
  (2D-2 c_L,max 0.65 against 0.99-1.01; 2D-1 c_L 20 % high), because at this lattice velocity (0.05) the
  pressure differences that make the lift are below fp16's resolution of the populations.
* **CUDA graphs**: on a GPU, runs of steps are captured once and replayed, so small grids are not bound by
  launch latency. Graphs come in several lengths (``GRAPH_LENGTHS``), so that an advance of any length
  (a frame of 50 steps, say) replays graphs for all but at most 10 of its steps (``graph_plan``; both in triton_plan.py).

On a CPU the kernel runs only under Triton's interpreter (``TRITON_INTERPRET=1`` set before this module is
imported), which is how the tests check it against the NumPy reference without a GPU.
"""

import os

import numpy as np
import torch
import triton
import triton.language as tl

from models.karman.solver.lattice import CX, CY, OPP, W
from models.karman.solver.operators import INLET_DIRS, OUTLET_DIRS, StepPlan
from models.karman.solver.triton_plan import FLAG_LINK, batch_capacity, bytes_per_simulation, graph_plan, interior_probes, link_tables

STORAGES = ("float32", "float64")


def launch_shape(nx: int) -> tuple[int, int]:
    """Cells per program along x and warps per program for rows of ``nx`` nodes: blocks of half a row (a power
    of two) up to 256 cells, one cell a thread up to 4 warps, two beyond. Measured on an H100, each size in one
    process (docs/gpu-solver.md): within 5 % of the fastest of five shapes tried at 16 x 128x64 (blocks of 64
    cells, 2 warps: 192,000 steps/s; 32 and 1: 202,000), 1024x256 (256 and 4: 36,700 MLUPS; 128 and 4:
    38,100) and 4096x1024 (256 and 4: 37,000; 128 and 2: 37,800)."""
    block = min(256, max(16, triton.next_power_of_2(-(-(nx - 1) // 2))))
    return block, max(1, min(4, block // 32))


def interpreting() -> bool:
    """Whether Triton runs its CPU interpreter (``TRITON_INTERPRET=1``) rather than compiling for a GPU."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(device: str) -> torch.device:
    """The torch device the kernel can run on; ValueError naming what is allowed otherwise."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: no CUDA GPU is visible here; the triton backend needs one (or "
                             "TRITON_INTERPRET=1 with device cpu, Triton's CPU interpreter)")
        return dev
    if dev.type == "cpu" and interpreting():
        return dev
    raise ValueError(f"device {device!r} is not offered by the triton backend; use cuda (or cpu under "
                     "TRITON_INTERPRET=1, Triton's CPU interpreter)")


@triton.jit
def _load(ptr, mask, CDT: tl.constexpr):
    """A population as the compute type."""
    return tl.load(ptr, mask=mask, other=0.0).to(CDT)


@triton.jit
def _store(ptr, value, mask):
    tl.store(ptr, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pull(fa, plane, nx, ny, y, xs, mask, I: tl.constexpr, OP: tl.constexpr, CXI: tl.constexpr, CYI: tl.constexpr,
          w, uin, drift, uc, anchor, first, last, FOLD: tl.constexpr, PERIODIC: tl.constexpr, CDT: tl.constexpr):
    """Population ``I`` streamed into cells (y, xs) from (y - c_y, xs - c_x), with the channel's boundaries
    folded in: half-way bounce-back off the wall rows, the inlet's velocity bounce-back (``uin``: the inflow
    at the source row) and the outlet's convective filter (``drift``: the outlet column's density deficit);
    ``first`` and ``last`` say whether this block holds the inlet's or the outlet's neighbour column."""
    if PERIODIC:  # the outer ring holds copies of the opposite side: wrap the source into the interior
        sy = y - CYI
        sy = tl.where(sy == 0, ny - 2, tl.where(sy == ny - 1, 1, sy))
        sx = xs - CXI
        sx = tl.where(sx == 0, nx - 2, tl.where(sx == nx - 1, 1, sx))
        v = _load(fa + I * plane + sy * nx + sx, mask, CDT)
    else:
        v = _pull_channel(fa, plane, nx, ny, y, xs, mask, I, OP, CXI, CYI, w, uin, drift, uc, anchor, first, last, FOLD, CDT)
    return v


@triton.jit
def _pull_channel(fa, plane, nx, ny, y, xs, mask, I: tl.constexpr, OP: tl.constexpr, CXI: tl.constexpr,
                  CYI: tl.constexpr, w, uin, drift, uc, anchor, first, last, FOLD: tl.constexpr, CDT: tl.constexpr):
    if CYI == 1:
        wall = y == 1
    elif CYI == -1:
        wall = y == ny - 2
    else:
        wall = y < 0  # never
    src = tl.where(wall, OP * plane + y * nx + xs, I * plane + (y - CYI) * nx + xs - CXI)
    v = _load(fa + src, mask, CDT)
    if FOLD:  # only the blocks at either end hold such a column: the others skip these loads
        if CXI == 1:
            if first:  # ghost (ys, 0) = f*_opp(ys + c_y, 1) + 6 w c_x u_in(ys): the cell's own f*_opp
                inlet = (xs == 1) & (wall == 0)
                own = _load(fa + OP * plane + y * nx + xs, mask & inlet, CDT)
                v = tl.where(inlet, own + 6.0 * w * uin, v)
        if CXI == -1:
            if last:  # ghost (ys, nx-1) one step behind: advance its filter with f*(ys, nx-2)
                outlet = (xs == nx - 2) & (wall == 0)
                beside = _load(fa + src - 1, mask & outlet, CDT)
                v = tl.where(outlet, (v + uc * beside) / (1.0 + uc) + w * anchor * drift, v)
    return v


@triton.jit
def _ghost(fa, fb, plane, nx, y, xs, mask, I: tl.constexpr, w, drift, uc, anchor, FOLD: tl.constexpr,
           CDT: tl.constexpr):
    """Write the outlet ghost of population ``I`` in row y into ``fb``, one step behind the interior."""
    at = mask & (xs == nx - 2)
    g = fa + I * plane + y * nx + nx - 1
    held = _load(g + xs * 0, at, CDT)
    if FOLD:
        beside = _load(g - 1 + xs * 0, at, CDT)
        held = (held + uc * beside) / (1.0 + uc) + w * anchor * drift
    _store(fb + I * plane + y * nx + nx - 1 + xs * 0, held, at)


@triton.jit
def _link(fa, plane, nx, cell, lmask, kind_row, coef_row, I: tl.constexpr, OP: tl.constexpr, CXI: tl.constexpr,
          CYI: tl.constexpr, f, CDT: tl.constexpr):
    """Interpolated bounce-back of population ``I`` off the obstacle where the link table says so:
    f_i = a f*_opp(x) + b f*_opp(x + c_i) + c f*_i(x). Returns the new f_i and each cell's exchanged momentum."""
    hit = lmask & (tl.load(kind_row + I, mask=lmask, other=0) == 2)
    a = tl.load(coef_row + I * 3, mask=hit, other=0.0).to(CDT)
    b = tl.load(coef_row + I * 3 + 1, mask=hit, other=0.0).to(CDT)
    c = tl.load(coef_row + I * 3 + 2, mask=hit, other=0.0).to(CDT)
    here = _load(fa + OP * plane + cell, hit, CDT)
    behind = _load(fa + OP * plane + cell + CYI * nx + CXI, hit, CDT)
    own = _load(fa + I * plane + cell, hit, CDT)
    new = a * here + b * behind + c * own
    exchanged = tl.where(hit, here + new, 0.0)
    return tl.where(hit, new, f), exchanged


@triton.jit
def _relax_pair(fi, fo, wrho, cu, base, hp, hm):
    """TRT collision of a direction i and its opposite (c_i . u = cu, weight times density wrho): the
    equilibrium's symmetric part w rho (1 + 4.5 cu^2 - 1.5 u^2) and antisymmetric part w rho 3 cu relax at
    the rates 2 hp and 2 hm."""
    ep = wrho * (base + 4.5 * cu * cu)
    em = wrho * 3.0 * cu
    p = hp * (fi + fo - 2.0 * ep)
    m = hm * (fi - fo - 2.0 * em)
    return fi - p - m, fo - p + m


# The slot and row numbers change from launch to launch: unspecialised, one compiled kernel serves them all
# (a CUDA graph captures launches that must not compile).
@triton.jit(do_not_specialize=["read_slot", "add_slot", "zero_slot", "force_row"])
def step_kernel(fa, fb, flags, block_links, link_row, link_kind, link_coef, inlet_u, rates, u_convect, outlet_sum, forces,
                ny, nx, read_slot, add_slot, zero_slot, force_row, anchor,
                FOLD: tl.constexpr, PERIODIC: tl.constexpr, CDT: tl.constexpr,
                BLOCK: tl.constexpr):
    """One time step of every simulation: fa (B, 9, ny, nx) post-collision -> fb. Grid: (x blocks, ny - 2
    interior rows, B simulations). ``rates`` (B, 2) holds half the TRT rates; ``inlet_u`` (B, 3, ny) the
    inflow of the inlet's three directions per ghost row; ``outlet_sum`` (3, B) three slots of the outlet
    column's summed density (read the last step's, add this step's, clear the next one's); ``forces``
    (steps, B, 2) gets the force on the obstacle in row ``force_row``; ``block_links`` (B, ny, x blocks) says
    which blocks hold a cell next to the obstacle."""
    px, py, sim = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    nsim = tl.num_programs(2)
    y = py + 1
    xs = px * BLOCK + tl.arange(0, BLOCK)  # blocks start at column 0, so that the loads along x and every store are aligned
    mask = (xs >= 1) & (xs < nx - 1)
    first = px == 0
    last = px == tl.num_programs(0) - 1  # the block that holds column nx - 2
    plane = ny * nx
    offset = sim.to(tl.int64) * 9 * plane  # 64-bit: a batch may exceed 2^31 populations
    fa += offset
    fb += offset
    cell = y * nx + xs
    hp = tl.load(rates + sim * 2).to(CDT)
    hm = tl.load(rates + sim * 2 + 1).to(CDT)
    uc = tl.load(u_convect + sim).to(CDT)
    drift = 1.0 - tl.load(outlet_sum + read_slot * nsim + sim).to(CDT) / (ny - 2)
    u1 = tl.load(inlet_u + (sim * 3 + 0) * ny + y).to(CDT)  # direction 1 (E): source row y
    u5 = tl.load(inlet_u + (sim * 3 + 1) * ny + tl.maximum(y - 1, 0)).to(CDT)  # 5 (NE): row y - 1
    u8 = tl.load(inlet_u + (sim * 3 + 2) * ny + tl.minimum(y + 1, ny - 1)).to(CDT)  # 8 (SE): row y + 1
    W0: tl.constexpr = 4.0 / 9.0
    WS: tl.constexpr = 1.0 / 9.0
    WD: tl.constexpr = 1.0 / 36.0
    zero = 0.0
    # Direction order: rest, E, N, W, S, NE, NW, SW, SE (models.karman.solver.lattice).
    f0 = _pull(fa, plane, nx, ny, y, xs, mask, 0, 0, 0, 0, W0, zero, drift, uc, anchor, first, last, FOLD, PERIODIC, CDT)
    f1 = _pull(fa, plane, nx, ny, y, xs, mask, 1, 3, 1, 0, WS, u1, drift, uc, anchor, first, last, FOLD, PERIODIC, CDT)
    f2 = _pull(fa, plane, nx, ny, y, xs, mask, 2, 4, 0, 1, WS, zero, drift, uc, anchor, first, last, FOLD, PERIODIC, CDT)
    f3 = _pull(fa, plane, nx, ny, y, xs, mask, 3, 1, -1, 0, WS, zero, drift, uc, anchor, first, last, FOLD, PERIODIC, CDT)
    f4 = _pull(fa, plane, nx, ny, y, xs, mask, 4, 2, 0, -1, WS, zero, drift, uc, anchor, first, last, FOLD, PERIODIC, CDT)
    f5 = _pull(fa, plane, nx, ny, y, xs, mask, 5, 7, 1, 1, WD, u5, drift, uc, anchor, first, last, FOLD, PERIODIC, CDT)
    f6 = _pull(fa, plane, nx, ny, y, xs, mask, 6, 8, -1, 1, WD, zero, drift, uc, anchor, first, last, FOLD, PERIODIC, CDT)
    f7 = _pull(fa, plane, nx, ny, y, xs, mask, 7, 5, -1, -1, WD, zero, drift, uc, anchor, first, last, FOLD, PERIODIC, CDT)
    f8 = _pull(fa, plane, nx, ny, y, xs, mask, 8, 6, 1, -1, WD, u8, drift, uc, anchor, first, last, FOLD, PERIODIC, CDT)

    flag = tl.load(flags + sim.to(tl.int64) * plane + cell, mask=mask, other=0)
    lmask = mask & (flag == 2)
    if tl.load(block_links + (sim * ny + y) * tl.num_programs(0) + px) != 0:  # a cell next to the obstacle: read its links
        row = tl.load(link_row + sim.to(tl.int64) * plane + cell, mask=lmask, other=0).to(tl.int64)
        kind_row = link_kind + row * 9
        coef_row = link_coef + row * 27
        f1, e1 = _link(fa, plane, nx, cell, lmask, kind_row, coef_row, 1, 3, 1, 0, f1, CDT)
        f2, e2 = _link(fa, plane, nx, cell, lmask, kind_row, coef_row, 2, 4, 0, 1, f2, CDT)
        f3, e3 = _link(fa, plane, nx, cell, lmask, kind_row, coef_row, 3, 1, -1, 0, f3, CDT)
        f4, e4 = _link(fa, plane, nx, cell, lmask, kind_row, coef_row, 4, 2, 0, -1, f4, CDT)
        f5, e5 = _link(fa, plane, nx, cell, lmask, kind_row, coef_row, 5, 7, 1, 1, f5, CDT)
        f6, e6 = _link(fa, plane, nx, cell, lmask, kind_row, coef_row, 6, 8, -1, 1, f6, CDT)
        f7, e7 = _link(fa, plane, nx, cell, lmask, kind_row, coef_row, 7, 5, -1, -1, f7, CDT)
        f8, e8 = _link(fa, plane, nx, cell, lmask, kind_row, coef_row, 8, 6, 1, -1, f8, CDT)
        # momentum exchange: the obstacle receives -c_i (f*_opp + f_i) per link, summed over the block's cells
        # first (two block reductions, not one per direction). Relaxed atomics: the launch's end orders them
        # before any reader, and an acquire-release one would hold the block until its earlier loads and stores are done.
        fx = tl.sum(-(e1 - e3 + e5 - e6 - e7 + e8), axis=0)
        fy = tl.sum(-(e2 - e4 + e5 + e6 - e7 - e8), axis=0)
        out = forces + (force_row * nsim + sim) * 2
        tl.atomic_add(out, fx.to(out.dtype.element_ty), sem="relaxed")
        tl.atomic_add(out + 1, fy.to(out.dtype.element_ty), sem="relaxed")

    # TRT collision (the formulas of numba_backend._collide)
    rho = f0 + f1 + f2 + f3 + f4 + f5 + f6 + f7 + f8
    inv = 1.0 / rho
    ux = (f1 - f3 + f5 - f6 - f7 + f8) * inv
    uy = (f2 - f4 + f5 + f6 - f7 - f8) * inv
    base = 1.0 - 1.5 * (ux * ux + uy * uy)
    rs = rho * WS
    rd = rho * WD
    g0 = f0 - 2.0 * hp * (f0 - rho * W0 * base)
    g1, g3 = _relax_pair(f1, f3, rs, ux, base, hp, hm)
    g2, g4 = _relax_pair(f2, f4, rs, uy, base, hp, hm)
    g5, g7 = _relax_pair(f5, f7, rd, ux + uy, base, hp, hm)
    g6, g8 = _relax_pair(f6, f8, rd, uy - ux, base, hp, hm)

    solid = flag == 1  # the obstacle's interior is held at rest
    fluid = solid == 0
    _store(fb + cell, tl.where(solid, W0, g0), mask)
    _store(fb + plane + cell, tl.where(solid, WS, g1), mask)
    _store(fb + 2 * plane + cell, tl.where(solid, WS, g2), mask)
    _store(fb + 3 * plane + cell, tl.where(solid, WS, g3), mask)
    _store(fb + 4 * plane + cell, tl.where(solid, WS, g4), mask)
    _store(fb + 5 * plane + cell, tl.where(solid, WD, g5), mask)
    _store(fb + 6 * plane + cell, tl.where(solid, WD, g6), mask)
    _store(fb + 7 * plane + cell, tl.where(solid, WD, g7), mask)
    _store(fb + 8 * plane + cell, tl.where(solid, WD, g8), mask)

    if PERIODIC == 0:
        # the outlet: this step's column density for the next step's drift, and the ghosts one step behind
        if last:
            at = mask & (xs == nx - 2) & fluid
            _ghost(fa, fb, plane, nx, y, xs, mask, 3, WS, drift, uc, anchor, FOLD, CDT)
            _ghost(fa, fb, plane, nx, y, xs, mask, 6, WD, drift, uc, anchor, FOLD, CDT)
            _ghost(fa, fb, plane, nx, y, xs, mask, 7, WD, drift, uc, anchor, FOLD, CDT)
            tl.atomic_add(outlet_sum + add_slot * nsim + sim, tl.sum(tl.where(at, rho, 0.0), axis=0).to(outlet_sum.dtype.element_ty), sem="relaxed")
        if (px == 0) & (py == 0):
            tl.store(outlet_sum + zero_slot * nsim + sim, 0.0)


class FusedBatch:
    """B simulations of one lattice size advanced together by ``step_kernel`` on ``device``.

    ``plans`` holds each simulation's StepPlan (geometry, rates, inflow), ``f`` the post-collision
    populations (B, 9, ny, nx) with their ghost nodes, ``storage`` one of STORAGES.
    """

    def __init__(self, plans: list[StepPlan], f: np.ndarray, device: str = "cuda", storage: str = "float32"):
        if storage not in STORAGES:
            raise ValueError(f"unknown storage {storage!r} for the triton backend; choose one of {', '.join(STORAGES)}")
        if len({p.periodic for p in plans}) != 1:
            raise ValueError("a batch mixes periodic boxes and channels; run them as separate batches")
        self.device = check_device(device)
        self.plans, self.storage = list(plans), storage
        self.batch, _, self.ny, self.nx = f.shape
        fits = batch_capacity(self.ny, self.nx, storage, device)
        if self.batch > fits:
            raise ValueError(f"batch {self.batch}: {self.batch} simulations of {self.nx}x{self.ny} in {storage} need "
                             f"{self.batch * bytes_per_simulation(self.ny, self.nx, storage) / 2**30:.1f} GiB; {device} has room for {fits}")
        self.periodic = plans[0].periodic
        on = lambda a, dt=None: torch.tensor(np.ascontiguousarray(a), dtype=dt, device=self.device)  # noqa: E731  (a copy, never a view)
        self.compute = torch.float64 if storage == "float64" else torch.float32
        self.fa = on(f, self.compute)
        self.fb = self.fa.clone()  # ghost populations no step writes keep their values in both buffers
        flags, rows, kinds, coefs = link_tables(self.plans, self.ny, self.nx)
        self.flags, self.link_row = on(flags), on(rows)
        self.block, self.warps = launch_shape(self.nx)
        blocks = triton.cdiv(self.nx - 1, self.block)  # columns 0 .. nx - 2, from column 0 (aligned)
        padded = np.zeros((self.batch, self.ny, blocks * self.block), bool)
        padded[:, :, : self.nx - 1] = flags[:, :, :-1] == FLAG_LINK
        self.block_links = on(padded.reshape(self.batch, self.ny, blocks, self.block).any(axis=3).astype(np.uint8))  # (B, ny, blocks)
        self.link_kind, self.link_coef = on(kinds), on(coefs, self.compute)
        self.rates = on([[0.5 * p.omega_plus, 0.5 * p.omega_minus] for p in plans], self.compute)
        self.u_convect = on([p.u_convect for p in plans], self.compute)
        self.anchor = float(plans[0].outlet_anchor)
        self.inlet_u = on(np.stack([p.inlet_u for p in plans]), self.compute)  # the last step's inflow (B, 3, ny)
        self._pending: np.ndarray | None = None  # a new inflow, folded in from the step after next
        self.outlet_sum = torch.zeros((3, self.batch), dtype=self.compute, device=self.device)
        self.launches = 0  # steps since the state was set (the first reads its ghost nodes as given)
        self._graphs: dict[tuple, tuple] = {}

    # -- state ------------------------------------------------------------------------------------------

    def state(self) -> np.ndarray:
        """Post-collision populations (B, 9, ny, nx), ghost nodes as the NumPy reference holds them."""
        f = self.current.cpu().numpy().copy()
        if self.launches == 0:
            return f
        if self.periodic:
            f[..., :, 0], f[..., :, -1] = f[..., :, -2], f[..., :, 1]
            f[..., 0, :], f[..., -1, :] = f[..., -2, :], f[..., 1, :]
            return f
        inlet = self.inlet_u.cpu().numpy()
        ny = self.ny
        for k, i in enumerate(INLET_DIRS):
            ys = np.arange(max(1, 1 - CY[i]), min(ny - 1, ny - 1 - CY[i]))
            f[:, i, ys, 0] = f[:, OPP[i], ys + CY[i], 1] + 6.0 * W[i] * CX[i] * inlet[:, k, ys]
        u = np.array([p.u_convect for p in self.plans])[:, None]
        drift = 1.0 - f[:, :, 1:-1, -2].sum(axis=1).mean(axis=1)[:, None]
        for i in OUTLET_DIRS:
            held = f[:, i, 1:-1, -1]
            f[:, i, 1:-1, -1] = (held + u * f[:, i, 1:-1, -2]) / (1.0 + u) + W[i] * self.anchor * drift
        return f

    def finite(self, row: int) -> bool:
        """Whether row ``row`` of every simulation's state is finite (checked on the device)."""
        return bool(torch.isfinite(self.current[:, :, row]).all())

    def finite_each(self, row: int) -> list[bool]:
        """Per simulation, whether row ``row`` of its state is finite."""
        return torch.isfinite(self.current[:, :, row]).flatten(1).all(dim=1).tolist()

    def set_inflow(self, inlet_u: np.ndarray) -> None:
        """New inflow (B, 3, ny) for the steps to come. The reference builds each step's inlet ghosts with
        that step's inflow and the next step pulls them, so the fold uses a new inflow from the step after
        the next on."""
        if self.launches == 0:
            self.inlet_u.copy_(torch.as_tensor(inlet_u, dtype=self.compute))
        else:
            self._pending = np.asarray(inlet_u)

    # -- stepping ---------------------------------------------------------------------------------------

    def _launch(self, forces: torch.Tensor, row: int) -> None:
        n = self.launches
        src, dst = (self.fa, self.fb) if n % 2 == 0 else (self.fb, self.fa)
        grid = (triton.cdiv(self.nx - 1, self.block), self.ny - 2, self.batch)
        cdt = tl.float64 if self.compute == torch.float64 else tl.float32
        step_kernel[grid](
            src, dst, self.flags, self.block_links, self.link_row, self.link_kind, self.link_coef, self.inlet_u, self.rates,
            self.u_convect, self.outlet_sum, forces, self.ny, self.nx, n % 3, (n + 1) % 3, (n + 2) % 3, row,
            self.anchor, FOLD=n > 0, PERIODIC=self.periodic, CDT=cdt,
            BLOCK=self.block, num_warps=self.warps,
        )
        self.launches += 1

    @property
    def current(self) -> torch.Tensor:
        """The buffer that holds the latest state."""
        return self.fa if self.launches % 2 == 0 else self.fb

    def _probe(self, probes: torch.Tensor) -> torch.Tensor:
        """Density (B, np) at the probe nodes of the latest state."""
        f = self.current[:, :, probes[:, 0], probes[:, 1]].to(self.compute)
        rho = f.sum(1)
        return rho

    def run(self, steps: int, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advance ``steps`` steps; the force on each obstacle per step (steps, B, 2) and the density at the
        ``probes`` nodes ((np, 2) rows of (y, x), interior nodes) per step (steps, B, np)."""
        probes = interior_probes(probes, self.ny, self.nx)
        at = torch.as_tensor(probes, device=self.device)
        forces = torch.zeros((steps, self.batch, 2), dtype=self.compute, device=self.device)
        rho = torch.zeros((steps, self.batch, len(probes)), dtype=self.compute, device=self.device)
        done = 0

        def eager(count: int) -> None:
            nonlocal done
            for _ in range(count):
                self._launch(forces, done)
                if len(probes):
                    rho[done] = self._probe(at)
                done += 1
                if self._pending is not None:  # the step after a new inflow folds it in
                    self.inlet_u.copy_(torch.as_tensor(self._pending, dtype=self.compute))
                    self._pending = None

        eager(min(steps, 1 if self._pending is not None or self.launches == 0 else 0))
        if self.device.type == "cuda":
            align, lengths = graph_plan(steps - done, self.launches)
            eager(align)  # a graph starts at buffer 0 and outlet slot 0
            for length in lengths:
                graph, chunk_forces, chunk_rho = self._graph(probes, length)
                graph.replay()
                forces[done : done + length] = chunk_forces
                rho[done : done + length] = chunk_rho
                done += length
                self.launches += length
        eager(steps - done)
        return forces.cpu().numpy().astype(np.float64), rho.cpu().numpy().astype(np.float64)

    def _graph(self, probes: np.ndarray, length: int):
        """A CUDA graph of ``length`` launches from launch parity 0 (built once per length and probe set). A graph
        replays the addresses it captured, so every tensor it reads is kept with it: the probe nodes' too."""
        key = (length, tuple(map(tuple, probes.tolist())))
        if key not in self._graphs:
            at = torch.as_tensor(probes, device=self.device)
            chunk_forces = torch.zeros((length, self.batch, 2), dtype=self.compute, device=self.device)
            chunk_rho = torch.zeros((length, self.batch, len(probes)), dtype=self.compute, device=self.device)
            graph = torch.cuda.CUDAGraph()
            launches = self.launches
            with torch.cuda.graph(graph):
                chunk_forces.zero_()
                for k in range(length):
                    self._launch(chunk_forces, k)
                    if len(probes):
                        chunk_rho[k] = self._probe(at)
            self.launches = launches  # capture runs nothing: the state and the step count are unchanged
            self._graphs[key] = (graph, chunk_forces, chunk_rho, at)
        return self._graphs[key][:3]
