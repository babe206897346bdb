import numpy as np
import pytest

from models.solver import ChannelSolver, FlowConfig, Obstacle
from models.solver.collision import equilibrium, moments, trt_collide, trt_rates
from models.solver.lattice import CX, CY, FLUID, SOLID, W

BACKENDS = ["numpy", "numba"]


def small_channel(dtype="float64", shape="circle"):
    return FlowConfig(nx=64, ny=32, reynolds=60.0, u_max=0.1, obstacle=Obstacle(shape=shape, cx=14, cy=16.5, size=6), dtype=dtype)


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_closed_box_conserves_mass(backend):
    cfg = FlowConfig(nx=40, ny=24, reynolds=50.0, u_max=0.1, obstacle=Obstacle(cx=15, cy=12, size=6), dtype="float64")
    nodes = np.full((24, 40), FLUID, np.uint8)
    nodes[[0, -1], :] = SOLID
    nodes[:, [0, -1]] = SOLID
    nodes[Obstacle(cx=15, cy=12, size=6).solid(24, 40)] = SOLID
    solver = ChannelSolver(cfg, backend=backend, nodes=nodes)
    solver.perturb(seed=3, amplitude=0.5)
    mass0 = solver.total_mass()
    solver.step(200)
    assert solver.total_mass() == pytest.approx(mass0, rel=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_periodic_box_conserves_momentum(backend):
    cfg = FlowConfig(nx=32, ny=16, reynolds=50.0, u_max=0.1, obstacle=Obstacle(cx=10, cy=8, size=4), dtype="float64")
    solver = ChannelSolver(cfg, backend=backend, nodes=np.full((16, 32), FLUID, np.uint8))
    solver.perturb(seed=4, amplitude=1.0)
    _, ux0, uy0 = moments(solver.f)
    p0 = (solver.f.sum(axis=0) * ux0).sum(), (solver.f.sum(axis=0) * uy0).sum()
    solver.step(100)
    rho, ux, uy = moments(solver.f)
    assert (rho * ux).sum() == pytest.approx(p0[0], abs=1e-12)
    assert (rho * uy).sum() == pytest.approx(p0[1], abs=1e-12)


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-11), ("float32", 2e-5)])
@pytest.mark.parametrize("shape", ["circle", "square", "ellipse"])
def test_backends_agree(dtype, tol, shape):
    ref = ChannelSolver(small_channel(dtype, shape), backend="numpy")
    fast = ChannelSolver(small_channel(dtype, shape), backend="numba")
    ref.perturb(seed=2)
    fast.perturb(seed=2)
    ref.step(60)
    fast.step(60)
    np.testing.assert_allclose(fast.f, ref.f, atol=tol)


def test_channel_develops_a_finite_wake_with_inflow_profile():
    solver = ChannelSolver(small_channel("float32"), backend="numba")
    solver.perturb(seed=0)
    solver.step(3000)
    fields = solver.fields()
    assert all(np.isfinite(v).all() for v in fields.values())
    # mean streamwise velocity across the outlet region equals the inflow's (mass flux is conserved)
    u = fields["u"]
    assert u[1:-1, -8].mean() == pytest.approx(u[1:-1, 2].mean(), rel=0.05)
    assert fields["mask"].sum() > 0 and (fields["u"][fields["mask"] > 0] == 0).all()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"reynolds": 0.0}, "Reynolds number 0 must be > 0"),
        ({"reynolds": -5.0}, "Reynolds number -5 must be > 0"),
        ({"obstacle": Obstacle(cx=14, cy=3, size=6)}, "touches or crosses a wall"),
        ({"obstacle": Obstacle(cx=2, cy=16, size=6)}, "touches the inlet or outlet"),
        ({"reynolds": 5000.0}, "outside the stable range"),
        ({"u_max": 0.3}, "Mach number"),
        ({"nx": 4}, "too small"),
    ],
)
def test_bad_configurations_are_refused_before_any_step(kwargs, message):
    base = dict(nx=64, ny=32, reynolds=60.0, u_max=0.1, obstacle=Obstacle(cx=14, cy=16.5, size=6))
    with pytest.raises(ValueError, match=message):
        ChannelSolver(FlowConfig(**{**base, **kwargs}), backend="numba")


def test_unknown_backend_lists_valid_names():
    with pytest.raises(ValueError, match="choose one of numpy, numba"):
        ChannelSolver(small_channel(), backend="cuda-magic")


def test_divergence_raises():
    solver = ChannelSolver(small_channel("float32"), backend="numba")
    solver.f[:, 16, 30] = np.nan
    with pytest.raises(FloatingPointError, match="diverged"):
        solver.step(5)
