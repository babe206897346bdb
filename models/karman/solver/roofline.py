"""The solver's memory roofline: a measured parallel copy bandwidth and the lattice updates per second it allows.

A D2Q9 step reads and writes every population of every node once, so at scale it is bound by memory
traffic, and the best it can do is the rate at which the device copies memory. The copy is measured
here, on buffers as large as the solver's two population buffers (out of every cache), with the
same stores the solver makes (ordinary cached stores; neither side uses streaming stores), and, on a
CPU, with the same number of threads. Bytes moved count what the program reads plus what it writes,
as MLUPS x ``bytes_per_cell`` does for the solver.
"""

import statistics
import time
from dataclasses import dataclass

import numba
import numpy as np

Q = 9  # populations per node (D2Q9)


def population_bytes(ny: int, nx: int, itemsize: int) -> int:
    """Bytes of one population buffer (Q planes of ny x nx nodes): the solver keeps two of them."""
    return Q * ny * nx * itemsize


def bytes_per_cell(itemsize: int, flag_bytes: int = 0) -> int:
    """Bytes a lattice update moves: Q populations read and Q written, plus ``flag_bytes`` for a kernel
    that reads a per-node flag (a one-byte cell type: 1)."""
    if itemsize <= 0 or flag_bytes < 0:
        raise ValueError(f"itemsize {itemsize} must be positive and flag_bytes {flag_bytes} not negative")
    return 2 * Q * itemsize + flag_bytes


def roofline_mlups(copy_gbs: float, cell_bytes: int) -> float:
    """Million lattice updates per second that a copy bandwidth of ``copy_gbs`` GB/s allows."""
    return copy_gbs * 1e3 / cell_bytes


def roofline_fraction(mlups: float, copy_gbs: float, cell_bytes: int) -> float:
    """Measured MLUPS as a fraction of the roofline."""
    return mlups / roofline_mlups(copy_gbs, cell_bytes)


@dataclass(frozen=True)
class CopyBandwidth:
    """A copy's bandwidth in GB/s (bytes read + bytes written per second): the median and every run."""

    gbs: float
    runs: tuple[float, ...]
    nbytes: int  # the size of each of the two buffers
    threads: int | None  # CPU threads; None on a GPU
    device: str


@numba.njit(parallel=True, cache=True)
def _parallel_copy(src, dst, chunks):
    """dst[:] = src[:] in ``chunks`` contiguous pieces spread over the threads."""
    n = src.shape[0]
    size = (n + chunks - 1) // chunks
    for c in numba.prange(chunks):
        lo = min(n, c * size)
        hi = min(n, lo + size)
        d, s = dst[lo:hi], src[lo:hi]
        for i in range(hi - lo):
            d[i] = s[i]


class NumbaCopy:
    """Two CPU buffers of ``nbytes`` and a numba parallel copy between them on ``threads`` threads (default:
    numba's current count), one contiguous piece per thread, as numba splits the solver's rows."""

    device = "cpu"

    def __init__(self, nbytes: int, threads: int | None = None):
        if nbytes <= 0:
            raise ValueError(f"copy buffers of {nbytes} bytes: must be positive")
        self.threads = threads or numba.get_num_threads()
        self.src = np.ones(-(-nbytes // 8), dtype=np.float64)
        self.dst = np.zeros_like(self.src)
        self.nbytes = self.src.nbytes
        self.once()  # compiles and touches every page

    def once(self) -> float:
        """GB/s of one copy (read + written)."""
        before = numba.get_num_threads()
        numba.set_num_threads(self.threads)
        try:
            t0 = time.perf_counter()
            _parallel_copy(self.src, self.dst, self.threads)
            seconds = time.perf_counter() - t0
        finally:
            numba.set_num_threads(before)
        return 2 * self.nbytes / seconds / 1e9


class TorchCopy:
    """Two torch buffers of ``nbytes`` on ``device`` (a CUDA GPU; any torch device works) and
    ``dst.copy_(src)`` between them, synchronised on CUDA."""

    def __init__(self, nbytes: int, device: str = "cuda"):
        import torch

        if nbytes <= 0:
            raise ValueError(f"copy buffers of {nbytes} bytes: must be positive")
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA device")
        self.device = str(dev)
        self.threads = torch.get_num_threads() if dev.type == "cpu" else None
        self.src = torch.ones(-(-nbytes // 4), dtype=torch.float32, device=dev)
        self.dst = torch.zeros_like(self.src)
        self.nbytes = self.src.numel() * self.src.element_size()
        self.once()  # warms up and touches every page

    def once(self) -> float:
        """GB/s of one copy (read + written), timed by CUDA events on a GPU (no host latency in it)."""
        import torch

        if self.device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.dst.copy_(self.src)
            end.record()
            end.synchronize()
            return 2 * self.nbytes / (start.elapsed_time(end) * 1e-3) / 1e9
        t0 = time.perf_counter()
        self.dst.copy_(self.src)
        return 2 * self.nbytes / (time.perf_counter() - t0) / 1e9


def copy_bandwidth(copier: NumbaCopy | TorchCopy, repeats: int = 5) -> CopyBandwidth:
    """The median bandwidth of ``repeats`` copies by ``copier``."""
    if repeats <= 0:
        raise ValueError(f"repeats {repeats} must be positive")
    runs = tuple(copier.once() for _ in range(repeats))
    return CopyBandwidth(statistics.median(runs), runs, copier.nbytes, copier.threads, copier.device)
