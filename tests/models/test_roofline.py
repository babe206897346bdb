"""The solver's memory roofline: bytes a lattice update moves, the MLUPS a copy bandwidth allows, and measured copies."""

import math

import numpy as np
import pytest

from models.karman.solver.roofline import (NumbaCopy, TorchCopy, bytes_per_cell, copy_bandwidth, population_bytes, roofline_fraction,
                                    roofline_mlups)


@pytest.mark.parametrize("dtype, flag_bytes, expected", [("float32", 0, 72), ("float64", 0, 144), ("float16", 0, 36), ("float32", 1, 73)])
def test_a_d2q9_update_reads_and_writes_nine_populations(dtype, flag_bytes, expected):
    assert bytes_per_cell(np.dtype(dtype).itemsize, flag_bytes) == expected


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="itemsize 0"):
        bytes_per_cell(0)
    with pytest.raises(ValueError, match="flag_bytes -1"):
        bytes_per_cell(4, -1)
    with pytest.raises(ValueError, match="repeats 0"):
        copy_bandwidth(NumbaCopy(4096, threads=1), repeats=0)


def test_the_roofline_is_the_copy_bandwidth_over_the_bytes_per_update():
    assert roofline_mlups(36.0, 72) == pytest.approx(500.0)  # 36 GB/s at 72 bytes per update
    assert roofline_fraction(400.0, 36.0, 72) == pytest.approx(0.8)
    assert population_bytes(64, 128, 4) == 9 * 64 * 128 * 4


@pytest.mark.parametrize("make", [lambda n: NumbaCopy(n, threads=1), lambda n: NumbaCopy(n), lambda n: TorchCopy(n, "cpu")],
                         ids=["numba-1-thread", "numba-all-threads", "torch-cpu"])
def test_a_measured_copy_moves_the_buffer_at_a_finite_positive_rate(make):
    copier = make(1 << 20)
    measured = copy_bandwidth(copier, repeats=3)
    assert measured.nbytes == 1 << 20 and len(measured.runs) == 3
    assert all(math.isfinite(r) and r > 0 for r in measured.runs) and measured.gbs == sorted(measured.runs)[1]
    copier.src[:] = 7
    copier.once()
    assert (copier.dst == 7).all()
