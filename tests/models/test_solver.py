"""The lattice Boltzmann solver: lattice isotropy, exact conservation of TRT collision, backends equal, boundaries and obstacles."""

import numpy as np
import pytest

from models.karman.solver import ChannelSolver, FlowConfig, Obstacle
from models.karman.solver.collision import equilibrium, moments, trt_collide, trt_rates
from models.karman.solver.geometry import obstacle_links, channel_nodes
from models.karman.solver.lattice import CX, CY, SOLID, W

FAST = ["numba", "torch"]
ALL = ["numpy", *FAST]
SHAPES = [("circle", 1.0), ("square", 1.0), ("rectangle", 2.0), ("ellipse", 0.5)]


def small_channel(dtype="float64", shape="circle", aspect=1.0, **kw):
    return FlowConfig(nx=64, ny=32, reynolds=60.0, u_max=0.1, dtype=dtype,
                      obstacle=Obstacle(shape=shape, cx=14.3, cy=16.2, size=6.5, aspect=aspect), **kw)


def test_lattice_isotropy():
    assert W.sum() == pytest.approx(1.0)
    assert (W * CX).sum() == pytest.approx(0.0) and (W * CY).sum() == pytest.approx(0.0)
    assert (W * CX * CX).sum() == pytest.approx(1 / 3)
    assert (W * CX * CY).sum() == pytest.approx(0.0)


def test_equilibrium_has_the_prescribed_moments():
    rng = np.random.default_rng(0)
    rho = 1 + 0.1 * rng.standard_normal((5, 7))
    ux, uy = 0.05 * rng.standard_normal((2, 5, 7))
    r, u, v = moments(equilibrium(rho, ux, uy))
    np.testing.assert_allclose(r, rho, rtol=1e-13)
    np.testing.assert_allclose(u, ux, atol=1e-13)
    np.testing.assert_allclose(v, uy, atol=1e-13)


def test_trt_collision_conserves_mass_and_momentum_and_fixes_equilibrium():
    rng = np.random.default_rng(1)
    f = equilibrium(np.ones((4, 4)), 0.05 * np.ones((4, 4)), np.zeros((4, 4))) + 1e-3 * rng.random((9, 4, 4))
    wp, wm = trt_rates(0.6)
    post = trt_collide(f, wp, wm)
    for a, b in zip(moments(f), moments(post)):
        np.testing.assert_allclose(a, b, atol=1e-14)
    feq = equilibrium(*moments(f))
    np.testing.assert_allclose(trt_collide(feq, wp, wm), feq, atol=1e-15)


def test_trt_magic_parameter_sets_the_odd_rate():
    wp, wm = trt_rates(0.56, magic=3 / 16)
    assert (1 / wp - 0.5) * (1 / wm - 0.5) == pytest.approx(3 / 16)


@pytest.mark.parametrize("shape,aspect", SHAPES)
def test_wall_fraction_lands_on_the_surface(shape, aspect):
    ob = Obstacle(shape=shape, cx=20.3, cy=15.6, size=7.3, aspect=aspect)
    nodes = channel_nodes(32, 48, ob)
    links = obstacle_links(nodes, ob)
    hx, hy = ob.half_extents
    hit = 0
    for (y, x), kinds, qs in zip(links.cells, links.kind, links.q):
        for i in np.nonzero(kinds == 2)[0]:
            q = qs[i]
            assert 0 < q <= 1
            px, py = x - q * CX[i], y - q * CY[i]  # the link runs from the node along -c_i
            if ob.rounded:
                assert ((px - ob.cx) / hx) ** 2 + ((py - ob.cy) / hy) ** 2 == pytest.approx(1.0, abs=1e-5)
            else:
                assert max(abs(px - ob.cx) / hx, abs(py - ob.cy) / hy) == pytest.approx(1.0, abs=1e-5)
            hit += 1
    assert hit > 8


def test_wall_fraction_on_an_axis_is_the_distance():
    ob = Obstacle(cx=20.0, cy=16.0, size=8.0)
    assert ob.wall_fraction(np.array([15.7]), np.array([16.0]), np.array([1.0]), np.array([0.0]))[0] == pytest.approx(0.3)


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 3e-5)])
@pytest.mark.parametrize("shape,aspect", SHAPES)
def test_backends_agree_with_the_numpy_reference(backend, dtype, tol, shape, aspect):
    ref = ChannelSolver(small_channel(dtype, shape, aspect), backend="numpy")
    fast = ChannelSolver(small_channel(dtype, shape, aspect), backend=backend)
    ref.perturb(seed=2)
    fast.perturb(seed=2)
    f_ref, _ = ref.advance(40)
    f_fast, _ = fast.advance(40)
    np.testing.assert_allclose(fast.f, ref.f, atol=tol)
    np.testing.assert_allclose(f_fast, f_ref, atol=50 * tol)
    assert np.abs(f_ref).max() > 1e-3  # the obstacle feels a force


@pytest.mark.parametrize("backend", ALL)
def test_probes_record_the_density(backend):
    solver = ChannelSolver(small_channel(), backend=backend)
    probes = np.array([[5, 30], [20, 40]])
    _, rho = solver.advance(3, probes)
    np.testing.assert_allclose(rho[-1], solver.f[:, probes[:, 0], probes[:, 1]].sum(axis=0), rtol=1e-12)


@pytest.mark.parametrize("backend", ALL)
def test_periodic_box_conserves_mass_and_momentum(backend):
    solver = ChannelSolver(small_channel(), backend=backend, periodic=True, obstacle=False)
    solver.perturb(seed=4, amplitude=1.0)

    def totals():
        f = solver.f[:, 1:-1, 1:-1]
        return f.sum(), (CX[:, None, None] * f).sum(), (CY[:, None, None] * f).sum()

    before = totals()
    solver.advance(100)
    after = totals()
    assert after[0] == pytest.approx(before[0], rel=1e-12)
    assert after[1] == pytest.approx(before[1], abs=1e-11)
    assert after[2] == pytest.approx(before[2], abs=1e-11)


@pytest.mark.parametrize("backend", ALL)
def test_halfway_obstacle_conserves_mass_exactly_and_interpolated_nearly(backend):
    # Interpolated bounce-back is not mass-conserving by construction (Bouzidi et al.): bounded drift only.
    for wall, rel in (("halfway", 1e-12), ("interpolated", 1e-2)):
        solver = ChannelSolver(small_channel(wall=wall), backend=backend, periodic=True)
        solver.perturb(seed=5, amplitude=1.0)
        mass = solver.total_mass()
        solver.advance(200)
        assert solver.total_mass() == pytest.approx(mass, rel=rel), wall


def test_channel_develops_a_finite_wake_and_carries_the_inflow_through():
    solver = ChannelSolver(small_channel("float32"), backend="numba")
    solver.perturb(seed=0)
    solver.advance(3000)
    fields = solver.fields()
    assert all(np.isfinite(v).all() for v in fields.values())
    u = fields["u"]
    # the mean streamwise velocity near the outlet equals the inflow's (mass flux is conserved)
    assert u[1:-1, -3].mean() == pytest.approx(u[1:-1, 2].mean(), rel=0.02)
    assert fields["mask"].sum() > 0 and (u[fields["mask"] > 0] == 0).all()
    assert np.abs(fields["v"]).max() > 0.05  # the wake is not a plain channel flow


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"reynolds": 0.0}, "Reynolds number 0 must be > 0"),
        ({"reynolds": -5.0}, "Reynolds number -5 must be > 0"),
        ({"obstacle": Obstacle(cx=14, cy=3, size=6)}, "touches or crosses a wall"),
        ({"obstacle": Obstacle(cx=14, cy=40, size=6)}, "touches or crosses a wall"),
        ({"obstacle": Obstacle(cx=2, cy=16, size=6)}, "touches the inlet or outlet"),
        ({"obstacle": Obstacle(cx=70, cy=16, size=6)}, "touches the inlet or outlet"),
        ({"obstacle": Obstacle(cx=30, cy=16, size=40)}, "touches or crosses a wall"),
        ({"reynolds": 5000.0}, "outside the stable range"),
        ({"reynolds": 0.5}, "outside the stable range"),
        ({"u_max": 0.3}, "Mach number"),
        ({"u_max": 0.05, "reynolds": 90.0}, "grid Reynolds number u_max/nu 22.5"),
        ({"u_max": 0.17}, r"stable range 0\.5578"),
        ({"nx": 4}, "too small"),
    ],
)
def test_bad_configurations_are_refused_before_any_step(kwargs, message):
    base = dict(nx=64, ny=32, reynolds=60.0, u_max=0.1, obstacle=Obstacle(cx=14, cy=16.5, size=6))
    with pytest.raises(ValueError, match=message):
        ChannelSolver(FlowConfig(**{**base, **kwargs}), backend="numba")


def test_unknown_backend_lists_valid_names():
    with pytest.raises(ValueError, match="choose one of numpy, numba, torch"):
        ChannelSolver(small_channel(), backend="cuda-magic")


@pytest.mark.parametrize("backend", ALL)
def test_divergence_raises(backend):
    solver = ChannelSolver(small_channel("float32"), backend=backend)
    f = solver.f
    f[:, 16, 30] = np.nan
    solver._stepper = solver._make_stepper(f)
    with pytest.raises(FloatingPointError, match="diverged"):
        solver.advance(5)


def test_torch_backend_on_an_xla_device_matches_the_reference():
    """In a child process (torch_xla is never imported beside the flows), on the PJRT CPU device."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT, XLA_CPU_ENV

    code = (
        "import numpy as np, torch_xla\n"
        "from models.karman.solver import ChannelSolver, FlowConfig, Obstacle\n"
        "cfg = FlowConfig(nx=48, ny=24, reynolds=40.0, u_max=0.1, obstacle=Obstacle(cx=10.3, cy=12.2, size=5.0))\n"
        "ref = ChannelSolver(cfg, backend='numpy'); ref.perturb(1)\n"
        "xla = ChannelSolver(cfg, backend='torch', device=str(torch_xla.device())); xla.perturb(1)\n"
        "fr, _ = ref.advance(10); fx, _ = xla.advance(10)\n"
        "print(np.abs(ref.f - xla.f).max(), np.abs(fr - fx).max())\n"
    )
    env = {**os.environ, **XLA_CPU_ENV, "CPU_NUM_DEVICES": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    state_gap, force_gap = map(float, proc.stdout.split())
    assert state_gap < 3e-5 and force_gap < 1e-3
