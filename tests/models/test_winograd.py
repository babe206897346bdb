"""Winograd F(3x3, 4x4): the convolution exactly in float64, rounding-sized in float32, and its gradients kept in step with the weights."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

from models.karman.nets.config import NetConfig
from models.karman.nets.pix2pix import build_discriminator, use_winograd
from models.karman.nets.pix2pix import Conv
from models.karman.nets.winograd import KernelCache, conv4x4, supports


def _all_grads(y, inputs):
    weights = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)  # a loss that sees every output
    return torch.autograd.grad((y * weights).sum(), inputs)


@pytest.mark.parametrize("shape,padding,bias", [
    ((2, 5, 9, 11), (1, 1), True),   # odd sizes: partial tiles at the bottom and right
    ((3, 4, 7, 7), (0, 2), False),   # unequal padding
    ((1, 3, 4, 4), (3, 3), True),    # the largest padding a 4×4 kernel takes
    ((2, 6, 12, 4), (0, 0), False),  # output one column wide
])
def test_winograd_is_the_convolution_exactly_in_float64(shape, padding, bias):
    """The transforms are exact in exact arithmetic: in float64 output and all three gradients
    match the direct convolution to rounding."""
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, shape[1], 4, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True) if bias else None
    inputs = (x, w, b) if bias else (x, w)
    fast, direct = conv4x4(x, w, b, padding), F.conv2d(x, w, b, padding=padding)
    torch.testing.assert_close(fast, direct, rtol=1e-11, atol=1e-11)
    for g_fast, g_direct in zip(_all_grads(fast, inputs), _all_grads(direct, inputs)):
        torch.testing.assert_close(g_fast, g_direct, rtol=1e-11, atol=1e-11)


def test_winograd_float32_error_on_the_patchgan_layer_is_rounding_sized():
    """The PatchGAN's 256 -> 512 layer at its 32×32 input: float32 results within 2e-5 of the
    largest value (the direct kernel itself differs from float64 by about 1e-6)."""
    torch.manual_seed(0)
    x = torch.randn(2, 256, 32, 32, dtype=torch.float64)
    w = torch.randn(512, 256, 4, 4, dtype=torch.float64) * 0.02
    dy = torch.randn(2, 512, 31, 31, dtype=torch.float64)
    exact = F.conv2d(x, w, padding=1)
    x32, w32 = x.float().requires_grad_(), w.float().requires_grad_()
    y = conv4x4(x32, w32, None, (1, 1))
    y.backward(dy.float())
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.conv2d(xe, we, padding=1).backward(dy)
    for got, want in ((y, exact), (x32.grad, xe.grad), (w32.grad, we.grad)):
        assert got.shape == want.shape
        assert ((got.double() - want).abs().max() / want.abs().max()).item() < 2e-5


def test_kernel_transforms_follow_in_place_weight_updates():
    """The cached kernel transforms are rebuilt after a (fused) optimiser step or a load changes the
    weight in place, so outputs keep matching the direct convolution."""
    torch.manual_seed(0)
    conv = Conv(6, 8, 4, 1, 1, bias=False)
    use_winograd(conv, min_channels=1)
    assert conv.winograd
    opt = torch.optim.Adam(conv.parameters(), lr=0.1, fused=True)
    x = torch.randn(2, 6, 10, 10)
    for _ in range(3):
        y = conv(x)
        torch.testing.assert_close(y, F.conv2d(x, conv.weight, padding=1), rtol=1e-5, atol=1e-5)
        opt.zero_grad()
        y.square().mean().backward()
        opt.step()
    with torch.no_grad():
        conv.load_state_dict({"weight": torch.ones_like(conv.weight)})
    torch.testing.assert_close(conv(x), F.conv2d(x, torch.ones_like(conv.weight), padding=1), rtol=1e-5, atol=1e-4)


def test_backward_refuses_a_weight_changed_after_the_forward():
    torch.manual_seed(0)
    w = torch.randn(4, 3, 4, 4, requires_grad=True)
    x = torch.randn(1, 3, 8, 8, requires_grad=True)
    y = conv4x4(x, w, None, (1, 1), KernelCache())
    with torch.no_grad():
        w.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_patchgan_uses_winograd_only_on_its_wide_stride_one_layer_and_is_the_same_network():
    torch.manual_seed(0)
    cfg = NetConfig(in_channels=4, out_channels=3, size=64, ndf=16)
    direct = build_discriminator(cfg)
    fast = use_winograd(copy.deepcopy(direct), min_channels=64)
    chosen = [(m.in_channels, m.out_channels) for m in fast.modules() if isinstance(m, Conv) and m.winograd]
    assert chosen == [(64, 128)]  # the stride-1 layer; the 1-channel output layer and strided ones stay direct
    cond, image = torch.randn(2, 4, 64, 64), torch.randn(2, 3, 64, 64, requires_grad=True)
    outs = [net(cond, image) for net in (direct, fast)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
    grads = [torch.autograd.grad(o.sum(), [image, *net.parameters()]) for o, net in zip(outs, (direct, fast))]
    for g_fast, g_direct in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_fast, g_direct, rtol=1e-3, atol=1e-4 * g_direct.abs().max().item())


def test_unsupported_inputs_fall_back_to_the_direct_kernel():
    conv = use_winograd(Conv(8, 8, 4, 1, 1), min_channels=1)
    x = torch.randn(1, 8, 6, 6)
    assert supports(conv, x)
    assert not supports(conv, x.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not supports(conv, x)
        assert conv(x).dtype == torch.bfloat16  # the direct kernel under autocast
    assert not supports(Conv(8, 8, 4, 2, 1), x)
    assert not supports(Conv(8, 8, 3, 1, 1), x)


def test_copies_of_a_layer_do_not_carry_its_cached_transforms():
    conv = use_winograd(Conv(8, 8, 4, 1, 1), min_channels=1)
    conv(torch.randn(1, 8, 6, 6))
    assert len(conv._kernel_cache._entries) == 1
    assert copy.deepcopy(conv)._kernel_cache._entries == {}
    assert pickle.loads(pickle.dumps(conv))._kernel_cache._entries == {}
