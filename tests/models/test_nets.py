import pytest
import torch

from models.device import DeviceUnavailable, resolve_device
from models.nets import NetConfig, build_discriminator, build_generator
from models.nets.trainer import OptimConfig, Pix2Pix


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
