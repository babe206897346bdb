"""The torch networks: the paper's sizes, output ranges, batch independence in eval mode, shapes refused, the device helper."""

import pytest
import torch

from models.device import DeviceUnavailable, resolve_device
from models.karman.nets.config import NetConfig
from models.karman.nets.pix2pix import build_discriminator, build_generator
from models.karman.nets.trainer import OptimConfig, Pix2Pix


def count(net):
    return sum(p.numel() for p in net.parameters())


def test_paper_networks_have_the_published_sizes():
    cfg = NetConfig(in_channels=3, out_channels=3, size=256)
    assert cfg.generator_depth == 8
    assert count(build_generator(cfg)) == pytest.approx(54.41e6, rel=1e-3)  # pix2pix unet_256: 54.414 M
    assert count(build_discriminator(cfg)) == pytest.approx(2.769e6, rel=1e-3)  # 70x70 PatchGAN: 2.769 M


def test_generator_maps_fields_to_tanh_range_on_non_square_frames():
    cfg = NetConfig(in_channels=4, out_channels=3, size=32, ngf=8, ndf=8)
    g, d = build_generator(cfg), build_discriminator(cfg)
    x = torch.randn(2, 4, 32, 64)
    y = g(x)
    assert y.shape == (2, 3, 32, 64)
    assert y.abs().max() <= 1.0
    assert d(x, y).shape[:2] == (2, 1)


def test_eval_output_of_a_sample_does_not_depend_on_its_batch():
    cfg = NetConfig(in_channels=4, out_channels=3, size=32, ngf=8, ndf=8)
    g = build_generator(cfg).eval()
    x = torch.randn(3, 4, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(g(x)[1:2], g(x[1:2]))


def test_image_size_the_unet_cannot_take():
    with pytest.raises(ValueError, match="multiples of 64"):
        NetConfig(size=64).check_image(48, 64)


def test_unknown_network_name_lists_valid_names():
    with pytest.raises(ValueError, match="choose one of unet"):
        build_generator(NetConfig(generator="resnet9"))


def test_a_few_steps_reduce_the_l1_loss():
    torch.manual_seed(0)
    cfg = NetConfig(in_channels=4, out_channels=3, size=32, ngf=8, ndf=8)
    model = Pix2Pix(cfg, OptimConfig(lr=1e-3))
    cond = torch.rand(4, 4, 32, 32) * 2 - 1
    target = torch.tanh(cond[:, :3] * 0.5)
    first = model.train_step(cond, target, lambda: torch.autocast("cpu", enabled=False))
    for _ in range(60):
        last = model.train_step(cond, target, lambda: torch.autocast("cpu", enabled=False))
    assert last["loss_l1"] < 0.9 * first["loss_l1"]


def test_unavailable_devices_fail_fast(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(DeviceUnavailable, match="cuda requested but no CUDA GPU"):
        resolve_device("cuda")
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    with pytest.raises(DeviceUnavailable, match="PJRT_DEVICE is not set"):
        resolve_device("xla")
    with pytest.raises(ValueError, match="choose one of cpu, cuda, xla"):
        resolve_device("tpu")


@pytest.mark.parametrize("side", [2, 4, 8])
def test_small_map_matrix_products_equal_the_convolutions(side):
    """The U-Net's strided convolutions computed as matrix products over unfolded patches give the
    same outputs and gradients as the convolution kernels."""
    from models.karman.nets.pix2pix import Down, Up

    torch.manual_seed(0)
    for layer in (Down(6, 5, bias=True), Up(6, 5, bias=True), Down(6, 5, bias=False)):
        x = torch.randn(3, 6, side, 2 * side, dtype=torch.float64, requires_grad=True)
        layer = layer.double()
        outs, grads = [], []
        for max_side in (0, 2 * side):
            layer.gemm_max_side = max_side
            y = layer(x)
            (g,) = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum(), x)
            outs.append(y)
            grads.append(g)
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)


def test_generator_with_small_map_products_is_the_same_network():
    from models.karman.nets.pix2pix import use_gemm_for_small_maps

    torch.manual_seed(0)
    cfg = NetConfig(in_channels=4, out_channels=3, size=64, ngf=4, ndf=4)
    g = build_generator(cfg).double().eval()
    x = torch.randn(2, 4, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        plain = g(x)
        fast = use_gemm_for_small_maps(g, 8)(x)
    torch.testing.assert_close(plain, fast, rtol=1e-10, atol=1e-10)


def test_the_constraints_zero_the_obstacle_and_hold_the_inlet_velocity_and_touch_nothing_else():
    from models.karman.recipe import get_recipe

    zero = [-0.5, 0.25, 0.125]  # u = v = p = 0 in network units
    recipe = get_recipe("default").with_overrides(constrain=True)
    model = Pix2Pix(NetConfig(size=32, ngf=8, ndf=8), OptimConfig.from_recipe(recipe, [0.1, 0.1, 0.1], zero))
    start = torch.rand(2, 4, 32, 64)
    start[:, 3] = -1.0
    start[:, 3, 10:14, 20:26] = 1.0  # the obstacle (the mask in network units: 1 inside)
    state = torch.rand(2, 3, 32, 64) + 2.0
    out = model.constrain(state, start)
    assert torch.equal(out[:, :, 10:14, 20:26], torch.tensor(zero).view(1, 3, 1, 1).expand(2, 3, 4, 6))
    assert torch.equal(out[:, :2, :, 0], start[:, :2, :, 0])  # the inlet's u and v
    assert torch.equal(out[:, 2, :, 0], state[:, 2, :, 0])  # its pressure is the prediction's
    rest = torch.ones(32, 64, dtype=torch.bool)
    rest[10:14, 20:26] = False
    rest[:, 0] = False
    assert torch.equal(out[..., rest], state[..., rest])
    unconstrained = Pix2Pix(NetConfig(size=32, ngf=8, ndf=8), OptimConfig.from_recipe(get_recipe("default"), [0.1, 0.1, 0.1]))
    assert unconstrained.constrain(state, start) is state
    with pytest.raises(ValueError, match="constrained"):
        OptimConfig.from_recipe(recipe, [0.1, 0.1, 0.1])


def test_discriminator_takes_no_weight_gradient_in_the_generator_step():
    """After a step, D's gradients are exactly those of the D loss: the G step added nothing to them."""
    import copy

    torch.manual_seed(0)
    cfg = NetConfig(in_channels=4, out_channels=3, size=32, ngf=8, ndf=8, dropout=0.0)
    model = Pix2Pix(cfg, OptimConfig())
    before = copy.deepcopy(model)
    cond, target = torch.rand(2, 4, 32, 32) * 2 - 1, torch.rand(2, 3, 32, 32) * 2 - 1
    model.train_step(cond, target, lambda: torch.autocast("cpu", enabled=False))
    fake = before.generator(cond).detach()
    real_logits, fake_logits = before.discriminator(cond, target), before.discriminator(cond, fake)
    loss_d = 0.5 * (before.bce(real_logits, torch.ones_like(real_logits)) + before.bce(fake_logits, torch.zeros_like(fake_logits)))
    loss_d.backward()
    for mine, expected in zip(model.discriminator.parameters(), before.discriminator.parameters()):
        torch.testing.assert_close(mine.grad, expected.grad)
    assert all(p.requires_grad for p in model.discriminator.parameters())


_HEAP_PROBE = """
import sys
import torch
from models.device import keep_freed_memory

def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = resident_mb()
t = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
del t
print(resident_mb() - before)
"""


@pytest.mark.parametrize("mode,kept", [("keep", True), ("default", False)])
def test_a_process_that_keeps_freed_memory_does_not_return_large_blocks(mode, kept):
    """By default glibc unmaps a freed 64 MiB block at once (the next one is zero-faulted afresh);
    after keep_freed_memory() it stays resident for reuse."""
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", _HEAP_PROBE, mode], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    grown = float(out.stdout.strip().splitlines()[-1])
    assert (grown > 48) == kept, grown


@pytest.mark.parametrize("options", [dict(), dict(ngf=16, ndf=16, size=64), dict(norm="instance", size=32),
                                     dict(upsample="resize", ngf=32, size=64, depth=4), dict(ngf=8, ndf=8, size=32, d_layers=2)])
def test_the_weight_count_from_the_shapes_is_the_built_networks(options):
    """The planner sizes a run without torch: its count must be the networks' own."""
    cfg = NetConfig(**options)
    built = (sum(p.numel() for p in build_generator(cfg).parameters()), sum(p.numel() for p in build_discriminator(cfg).parameters()))
    assert cfg.weight_count() == built


@pytest.mark.parametrize("recipe, upsample, crop, small_maps", [("default", None, None, False), ("paper", None, None, True),
                                                                 ("default", "transpose", None, True), ("paper", "resize", 32, False)])
def test_the_training_flops_from_the_shapes_are_what_torch_counts_in_a_step(recipe, upsample, crop, small_maps):
    """MFU's numerator: the count from the layer shapes (NetConfig.training_flops) against torch's own
    FlopCounterMode over one real training step (forward, backward, with and without the adversarial
    term, unrolled or not, through the small-map GEMM path or not), within 2 %."""
    from torch.utils.flop_counter import FlopCounterMode

    from models.device import resolve_device
    from models.karman.nets.trainer import build_trainer, speed_options
    from models.karman.recipe import OptimConfig, get_recipe

    r = get_recipe(recipe).with_overrides(upsample=upsample)
    height, width = (crop, crop) if crop else (32, 64)
    net = NetConfig(size=min(height, width), ngf=8, ndf=8, upsample=r.upsample, output=r.output, dropout=r.dropout)
    ctx = resolve_device("cpu", "fp32", data_parallel=False)
    options = speed_options("cpu", "fp32", "off", "off", "off") | {"keep_freed_memory": False, "gemm_max_side": 8 if small_maps else 0}
    trainer = build_trainer(net, OptimConfig.from_recipe(r, [0.1, 0.1, 0.1] if r.predict == "delta" else None), ctx, options)
    batch = 2
    cond, target = torch.randn(batch, 4, height, width), torch.randn(batch, 3 * r.unroll, height, width)
    with FlopCounterMode(display=False) as counter:
        trainer.train_step(cond, target, ctx.autocast)
    counted = counter.get_total_flops() / batch
    assert counted > 0
    assert net.training_flops(height, width, r.unroll, r.gan_weight > 0) == pytest.approx(counted, rel=0.02)


@pytest.mark.parametrize("module, name", [("surrogate", "Surrogate"), ("pix2pix", "UNetGenerator"), ("winograd", "KernelCache")])
def test_a_pickle_made_before_the_networks_moved_finds_its_classes(module, name):
    """MLflow's torch models pickle their classes by module path; those logged before models/karman/ name models.nets.*."""
    import importlib
    import pickle

    old = pickle.loads(f"cmodels.nets.{module}\n{name}\n.".encode())  # protocol 0: a GLOBAL opcode, the class itself
    assert old is getattr(importlib.import_module(f"models.karman.nets.{module}"), name)
