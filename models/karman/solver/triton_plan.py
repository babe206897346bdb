"""The fused Triton solver's host side: the cell flags and link tables it reads, how runs of steps split into CUDA graphs, and how many simulations fit on a device (no Triton needed)."""

import numpy as np
import torch

from models.karman.solver.operators import StepPlan

FLAG_FLUID, FLAG_SOLID, FLAG_LINK = 0, 1, 2
# Steps per captured CUDA graph, longest first: each a multiple of 6 (buffer parity 2 x outlet slot cycle 3), so
# that a graph ends where it started. Halving from 96 covers every multiple of 6 with few graphs.
GRAPH_LENGTHS = (120, 96, 48, 24, 12, 6)


def graph_plan(steps: int, launches: int) -> tuple[int, list[int]]:
    """How a GPU advances ``steps`` steps after ``launches`` launches: (eager launches first, until the launch
    count is a multiple of 6, where every graph starts; the graphs' lengths, longest first). The steps left
    after them, fewer than 6, run eagerly too."""
    if steps < 0 or launches < 0:
        raise ValueError(f"steps {steps} and launches {launches} must not be negative")
    align = min(steps, -launches % 6)
    rest, lengths = steps - align, []
    for length in GRAPH_LENGTHS:
        while rest >= length:
            lengths.append(length)
            rest -= length
    return align, lengths


def link_tables(plans: list[StepPlan], ny: int, nx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cell flags (B, ny, nx) uint8, link rows (B, ny, nx) int32, and the concatenated link tables:
    kinds (L, 9) uint8 and coefficients (L, 9, 3)."""
    flags = np.zeros((len(plans), ny, nx), np.uint8)
    rows = np.zeros((len(plans), ny, nx), np.int32)
    start = 0
    for b, plan in enumerate(plans):
        flags[b][plan.solid[:, 0], plan.solid[:, 1]] = FLAG_SOLID
        flags[b][plan.cells[:, 0], plan.cells[:, 1]] = FLAG_LINK
        rows[b][plan.cells[:, 0], plan.cells[:, 1]] = start + np.arange(len(plan.cells))
        start += len(plan.cells)
    kinds = np.concatenate([p.kind for p in plans]) if start else np.zeros((1, 9), np.uint8)
    coefs = np.concatenate([p.coef for p in plans]) if start else np.zeros((1, 9, 3))
    return flags, rows, kinds, coefs


def interior_probes(probes: np.ndarray, ny: int, nx: int) -> np.ndarray:
    """``probes`` as (np, 2) int64 rows of (y, x); ValueError unless every one is an interior node (the kernel
    keeps ghost nodes one step behind, so their density is not the step's)."""
    probes = np.asarray(probes, np.int64).reshape(-1, 2)
    if len(probes) and ((probes[:, 0] < 1) | (probes[:, 0] > ny - 2) | (probes[:, 1] < 1) | (probes[:, 1] > nx - 2)).any():
        raise ValueError(f"probe nodes {probes.tolist()} must be interior: rows 1..{ny - 2}, columns 1..{nx - 2}")
    return probes


def bytes_per_simulation(ny: int, nx: int, storage: str) -> int:
    """Device memory one simulation of a batch holds: two population buffers, the cell flag and link row
    (1 + 4 bytes a node), and the state read back at the end of a run."""
    item = 8 if storage == "float64" else 4
    return ny * nx * (3 * 9 * item + 5)


def batch_capacity(ny: int, nx: int, storage: str, device: str) -> int:
    """How many simulations of ny x nx fit in 90 % of the device's free memory (no limit off a GPU)."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return 1 << 30
    free, _ = torch.cuda.mem_get_info(dev)
    return int(0.9 * free // bytes_per_simulation(ny, nx, storage))
