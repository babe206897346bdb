"""Coarse Schäfer-Turek runs in CI time, with bounds looser than the default resolution's 2%."""

import numpy as np
import pytest

from models.karman.solver.benchmark import LATTICE_U_MEAN, REFERENCE, Setup, periods, run, within


def test_setup_reproduces_the_benchmark_geometry():
    setup = Setup("2D-2", 20)
    cfg = setup.config()
    assert (cfg.ny - 2, cfg.nx - 2) == (82, 440)  # 0.41 and 2.2 at 20 nodes per 0.1
    assert cfg.obstacle.size == 20 and cfg.obstacle.cx == cfg.obstacle.cy == 40.5
    assert cfg.reynolds == 100 and cfg.u_mean == pytest.approx(setup.lattice_u_mean)
    # one lattice step in seconds: dx / (U_phys / U_lattice)
    assert setup.dt == pytest.approx(0.005 * setup.lattice_u_mean / 1.0)


def test_each_case_has_its_own_lattice_velocity_and_a_given_one_is_bounded():
    assert Setup("2D-1", 40).lattice_u_mean == LATTICE_U_MEAN["2D-1"] == 0.02  # Mach 0.05 at the peak: 2D-1's pressure difference
    assert Setup("2D-2", 60).lattice_u_mean == LATTICE_U_MEAN["2D-2"] == 0.05
    slow, fast = Setup("2D-1", 40, 0.01), Setup("2D-1", 40)
    assert slow.config().u_max == pytest.approx(0.015) and slow.dt == pytest.approx(fast.dt / 2)
    assert slow.config().tau < fast.config().tau  # the same Reynolds number at a lower velocity: a lower viscosity
    for u in (0.0, -0.01, 0.11):
        with pytest.raises(ValueError, match=f"lattice velocity {u} must be above 0 and at most 0.1"):
            Setup("2D-2", 20, u)


@pytest.mark.parametrize("n", [0, 5, 25])
def test_resolutions_must_be_multiples_of_ten(n):
    with pytest.raises(ValueError, match="multiple of 10"):
        Setup("2D-1", n)


def test_pressure_stencil_is_exact_for_linear_fields():
    setup = Setup("2D-1", 20)
    nodes, weights = setup.pressure_stencil()
    field = 0.3 + 0.01 * nodes[:, 1] - 0.02 * nodes[:, 0]  # a linear density field at the stencil nodes
    front, back = weights @ field
    c, r = 40.5, 10.0
    assert front == pytest.approx(0.3 + 0.01 * (c - r) - 0.02 * c)
    assert back == pytest.approx(0.3 + 0.01 * (c + r) - 0.02 * c)
    cfg = setup.config()
    from models.karman.solver.geometry import channel_nodes

    assert (channel_nodes(cfg.ny, cfg.nx, cfg.obstacle)[nodes[:, 0], nodes[:, 1]] == 0).all()  # all fluid


def test_periods_finds_the_frequency_of_a_sine():
    t = np.arange(5000)
    up = periods(np.sin(2 * np.pi * t / 123.4) + 0.2)
    assert np.diff(up).mean() == pytest.approx(123.4, rel=1e-3)


@pytest.mark.full  # one of the slowest of its module: the full tier runs it
def test_steady_case_2d1_at_coarse_resolution():
    quantities, history, stats = run(Setup("2D-1", 20))
    assert stats["converged"]
    assert within(quantities["cd"], REFERENCE["2D-1"]["cd"], 0.02)
    assert within(quantities["cl"], REFERENCE["2D-1"]["cl"], 0.08)
    assert within(quantities["dp"], REFERENCE["2D-1"]["dp"], 0.03)


def test_periodic_case_2d2_at_coarse_resolution():
    quantities, history, stats = run(Setup("2D-2", 20))
    assert stats["converged"]
    assert within(quantities["st"], REFERENCE["2D-2"]["st"])  # the shedding frequency is right even here
    assert within(quantities["cd_max"], REFERENCE["2D-2"]["cd_max"], 0.03)
    assert within(quantities["cl_max"], REFERENCE["2D-2"]["cl_max"], 0.06)
    assert within(quantities["dp"], REFERENCE["2D-2"]["dp"], 0.03)
    assert history.cl.min() < -0.8 < 0.8 < history.cl.max()  # the lift swings both ways: vortex shedding


def test_the_ladder_ends_at_the_case_and_backend_default_or_the_resolution_asked_for():
    # the fused GPU kernel's 2D-2 default is 90 nodes, where fp32 on an H100 lies inside every interval
    from tasks.workloads.karman.specs import ValidateSpec
    from tasks.workloads.karman.validate.task import resolutions

    assert resolutions(ValidateSpec(case="2D-1")) == [10, 20, 40]
    assert resolutions(ValidateSpec(case="2D-2")) == [10, 30, 60]
    assert resolutions(ValidateSpec(case="2D-2", backend="triton", device="cuda")) == [20, 40, 90]
    assert resolutions(ValidateSpec(case="2D-2", backend="triton", device="cuda", cells_per_diameter=60, convergence=[30])) == [30, 60]
