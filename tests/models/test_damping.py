"""The damping of the predicted change's highest wavenumbers: its transfer function, numpy = torch, and its use in rollouts."""

import numpy as np
import pytest
import torch

from models.karman.damping import blur, check_strength, damp
from models.karman.nets.surrogate import Surrogate
from models.karman.nets.surrogate import damp as damp_torch
from tasks.workloads.karman.data import Normalizer, StepCodec

H, W = 16, 24


def mode(kx: float, ky: float) -> np.ndarray:
    """cos(kx·x + ky·y) on an H × W grid of cells."""
    y, x = np.mgrid[0:H, 0:W]
    return np.cos(kx * x + ky * y).astype(np.float32)


@pytest.mark.parametrize("strength", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("kx, ky", [(np.pi, np.pi), (np.pi, 0.0), (0.0, np.pi), (np.pi / 4, 0.0), (np.pi / 3, np.pi / 6)])
def test_a_mode_is_scaled_by_the_transfer_function_away_from_the_edges(strength, kx, ky):
    """1 - d·(1 - cos²(kx/2)·cos²(ky/2)): the Nyquist modes lose d, a smooth wave little; the edges (where
    the values are repeated) are left out."""
    x = mode(kx, ky)
    gain = 1 - strength * (1 - np.cos(kx / 2) ** 2 * np.cos(ky / 2) ** 2)
    np.testing.assert_allclose(damp(x, strength)[1:-1, 1:-1], gain * x[1:-1, 1:-1], atol=1e-5)


def test_a_constant_and_a_ramp_along_an_axis_pass_unchanged_edges_included():
    ramp = np.broadcast_to(np.arange(W, dtype=np.float32), (H, W))
    np.testing.assert_allclose(damp(np.full((H, W), 3.0, np.float32), 1.0), 3.0)
    # a linear ramp is its own average inside; at the two edge columns the repeated value pulls it a quarter cell in
    out = damp(ramp, 1.0)
    np.testing.assert_allclose(out[:, 1:-1], ramp[:, 1:-1], atol=1e-5)
    np.testing.assert_allclose(out[:, 0], 0.25, atol=1e-6)


@pytest.mark.parametrize("strength", [1.5, 2.0, 2.5])
@pytest.mark.parametrize("kx, ky", [(np.pi / 2, 0.0), (np.pi / 3, np.pi / 6), (np.pi / 4, np.pi / 4)])
def test_above_one_whole_passes_then_the_fraction_multiply_their_transfer_functions(strength, kx, ky):
    """d = 2 is the [1, 4, 6, 4, 1]/16 filter, T_1²; d = 1.5 is T_1·T_0.5. Each pass reaches one more cell
    in from the edges, so the comparison leaves out as many."""
    x = mode(kx, ky)
    t1 = np.cos(kx / 2) ** 2 * np.cos(ky / 2) ** 2
    whole = int(strength)
    gain = t1**whole * (1 - (strength - whole) * (1 - t1))
    edge = int(np.ceil(strength))
    np.testing.assert_allclose(damp(x, strength)[edge:-edge, edge:-edge], gain * x[edge:-edge, edge:-edge], atol=1e-5)


def test_zero_strength_is_the_identity_and_strengths_outside_zero_to_three_are_refused():
    x = np.random.default_rng(0).normal(size=(3, H, W)).astype(np.float32)
    assert damp(x, 0.0) is x
    assert check_strength(2.5) == 2.5
    with pytest.raises(ValueError, match=r"damping 3.5 is the passes of the binomial filter .* choose 0 \(none\) to 3"):
        check_strength(3.5)


@pytest.mark.parametrize("strength", [0.6, 1.7])
def test_torch_computes_what_numpy_computes_per_channel_and_sample(strength):
    x = np.random.default_rng(1).normal(size=(2, 3, H, W)).astype(np.float32)
    np.testing.assert_allclose(damp_torch(torch.from_numpy(x), strength).numpy(), damp(x, strength), atol=1e-6)
    np.testing.assert_allclose(blur(x[0, 0]), blur(x[:, :, :, :])[0, 0], atol=0)


def test_the_rollouts_codec_and_the_logged_model_add_the_damped_change():
    """StepCodec (every rollout) and the MLflow Surrogate decode a damped output alike, from the meta a run saves."""
    norm = Normalizer(center=[0.05, 0.0, 0.0], scale=[0.1, 0.05, 0.01])
    meta = {"normalizer": {"center": norm.center, "scale": norm.scale}, "predict": "delta", "delta_scale": [0.002, 0.004, 0.001],
            "damping": 0.5}
    codec = StepCodec.from_meta(meta)
    state = np.random.default_rng(2).normal(size=(4, H, W)).astype(np.float32)
    out = np.broadcast_to(mode(np.pi, np.pi), (3, H, W)).copy()  # a checkerboard change: half of it is kept
    pred = codec.next_state(state, out)
    expected = state[:3] + 0.5 * out * np.array(meta["delta_scale"], np.float32)[:, None, None]
    np.testing.assert_allclose(pred[:, 1:-1, 1:-1], expected[:, 1:-1, 1:-1], atol=1e-6)

    class Fixed(torch.nn.Module):  # a generator whose output is the checkerboard
        def forward(self, x):
            return torch.from_numpy(out)[None].expand(x.shape[0], -1, -1, -1)

    surrogate = Surrogate(Fixed(), norm.center, norm.scale, meta["delta_scale"], damping=0.5)
    with torch.no_grad():
        logged = surrogate(torch.from_numpy(state)[None]).numpy()[0]
    np.testing.assert_allclose(logged, pred, atol=1e-6)
    assert StepCodec.from_meta({k: v for k, v in meta.items() if k != "damping"}).damping == 0.0  # a model from before damping
