"""The calo step's speed choices give the step it had: the broadcast upsampling is nearest interpolation, the batch-norm moments' dtype follows the device, the batches gather precomputed images."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F


def test_the_broadcast_upsampling_is_nearest_interpolation_forward_and_backward():
    from models.calo.torch import upsample

    x = torch.randn(2, 3, 4, 5, 3, dtype=torch.float64, requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    ours, theirs = upsample(x, (2, 3, 1)), F.interpolate(y, scale_factor=(2, 3, 1), mode="nearest")
    assert ours.shape == theirs.shape == (2, 3, 8, 15, 3)
    assert torch.equal(ours, theirs)
    weight = torch.randn_like(theirs)
    (ours * weight).sum().backward()
    (theirs * weight).sum().backward()
    assert torch.allclose(x.grad, y.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("moments", [torch.float64, torch.float32])
def test_batch_norm_takes_its_moments_in_the_dtype_set_and_moves_its_statistics(moments):
    from models.calo.nets import BN_MOMENTUM
    from models.calo.torch import BatchNorm

    torch.manual_seed(0)
    x = 3.0 + 2.0 * torch.randn(4, 2, 6, 5, 4)
    bn = BatchNorm(2)
    bn.moments = moments
    out = bn(x)
    wide = x.double()
    mean, var = wide.mean(dim=(0, 2, 3, 4)), wide.var(dim=(0, 2, 3, 4), unbiased=False)
    expected = (wide - mean.view(1, -1, 1, 1, 1)) / torch.sqrt(var.view(1, -1, 1, 1, 1) + 1e-6)
    assert torch.allclose(out.double(), expected, atol=1e-5)
    assert torch.allclose(bn.running_mean.double(), (1 - BN_MOMENTUM) * mean, atol=1e-6)
    assert torch.allclose(bn.running_var.double(), BN_MOMENTUM + (1 - BN_MOMENTUM) * var, atol=1e-6)


def test_a_cpu_trainer_takes_float64_moments_and_its_batches_gather_the_precomputed_images():
    from tasks.common.specs import TrainSpec
    from models.calo.nets import NetConfig
    from tasks.workloads.calo.torch import CaloTorch
    from models.calo.torch import BatchNorm
    from tasks.workloads.calo.workload import to_image
    from tests.workloads.calo_step import data_of
    from tests.workloads.digits_step import runtime_of

    cfg = NetConfig(latent=8, width=0.25, pool=3)
    trainer = CaloTorch(data_of(), TrainSpec(workload="calo", dataset="calo", seed=0), 4, runtime_of("torch"), cfg)
    norms = [m for net in (trainer.g, trainer.d) for m in net.modules() if isinstance(m, BatchNorm)]
    assert norms and all(bn.moments == torch.float64 for bn in norms)
    take = np.array([4, 1, 3])
    batch = trainer.batch_of(take, np.random.default_rng(0))
    cells = trainer.cells["train"][take]
    assert np.array_equal(batch["image"], to_image(cells))
    assert np.allclose(batch["ecal"][:, 0], cells.sum(axis=(1, 2, 3), dtype=np.float64), rtol=1e-6)


@pytest.mark.parametrize("block, channels_last", [(8, False), (3, True), (16, False)])
def test_convolutions_over_runs_of_depths_are_torchs_3d_convolutions_forward_and_backward(block, channels_last):
    """depth_blocks against F.conv3d in float64, the published layers' kernels (the generator's first, the
    discriminator's first from one channel, the last 2x2x2), depths that do and do not fill whole blocks."""
    from models.calo.torch import depth_blocks

    torch.manual_seed(block)
    for cin, cout, kernel, shape in ((8, 8, (6, 6, 8), (9, 8, 20)), (1, 16, (5, 6, 6), (7, 8, 13)), (6, 1, (2, 2, 2), (4, 5, 7))):
        x = torch.randn(2, cin, *shape, dtype=torch.float64, requires_grad=True)
        w = torch.randn(cout, cin, *kernel, dtype=torch.float64, requires_grad=True)
        b = torch.randn(cout, dtype=torch.float64, requires_grad=True)
        ours, theirs = depth_blocks(x, w, b, block, channels_last), F.conv3d(x, w, b)
        assert ours.shape == theirs.shape
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-10)
        weight = torch.randn_like(theirs)
        assert all(torch.allclose(g, h, rtol=0, atol=1e-10) for g, h in zip(torch.autograd.grad((ours * weight).sum(), (x, w, b)),
                                                                               torch.autograd.grad((theirs * weight).sum(), (x, w, b))))


def test_a_cuda_trainer_runs_its_convolutions_over_runs_of_depths_and_a_cpu_one_in_3d():
    from models.calo.torch import DEPTH_BLOCKS

    assert DEPTH_BLOCKS.get("cpu", (0, False)) == (0, False)
    assert DEPTH_BLOCKS["cuda"][0] > 1
