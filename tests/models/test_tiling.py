"""Map-reduce tiling: tiles cover the frame and merge back, keep the U-Net's stride grid, and equal full-frame where the trim covers the receptive field."""

import numpy as np
import pytest
import torch
from torch import nn

from models.device import resolve_device
from models.karman.inference import Predictor, make_runner
from models.karman.nets.config import NetConfig
from models.karman.nets.pix2pix import build_generator
from models.karman.tiling import TilePlan, TilingError, pack_groups, unpack_groups

PLANS = [
    dict(height=64, width=128, tile=(64, 64), halo=8, unit=64),
    dict(height=100, width=300, tile=(64, 64), halo=8, unit=64),
    dict(height=48, width=100, tile=(32, 40), halo=6, unit=1, trim=3),
    dict(height=256, width=1024, tile=(256, 576), halo=16, unit=64),
]


@pytest.mark.parametrize("kwargs", PLANS)
def test_tiles_cover_the_frame_with_the_halo_and_merge_back_exactly(kwargs):
    plan = TilePlan(**kwargs)
    th, tw = plan.tile
    for offsets, length, side in ((plan.rows, plan.height, th), (plan.cols, plan.width, tw)):
        assert offsets[0] == 0 and offsets[-1] + side == length
        assert all(a + side - b >= 2 * plan.halo for a, b in zip(offsets, offsets[1:]))  # overlap of 2 x halo
    weights = plan.weights()
    total = np.zeros((plan.height, plan.width))
    for w, (r, c) in zip(weights, plan.offsets()):
        total[r : r + th, c : c + tw] += w
    np.testing.assert_allclose(total, 1.0, atol=1e-12)  # a partition of unity: no pixel lost, none doubled
    frame = np.random.default_rng(0).normal(size=(3, plan.height, plan.width))
    np.testing.assert_allclose(plan.merge(plan.split(frame)), frame, atol=1e-12)


def test_offsets_keep_the_unet_stride_grid_when_the_frame_allows():
    plan = TilePlan(256, 1024, (256, 576), halo=16, unit=64)
    assert plan.cols == [0, 448] and plan.rows == [0]
    assert plan.overhead == pytest.approx(1.125)


def _local_net() -> nn.Module:
    """Three 3x3 convolutions: every output pixel sees inputs within 3 pixels (receptive radius 3)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.Tanh(), nn.Conv2d(8, 8, 3, padding=1), nn.Tanh(),
                         nn.Conv2d(8, 3, 3, padding=1)).eval()


@pytest.mark.parametrize("workers,group", [(1, None), (2, None), (2, 1), (1, 3)])
def test_mapreduce_equals_full_frame_when_the_trim_covers_the_receptive_field(workers, group):
    model = _local_net()
    frame = np.random.default_rng(1).normal(size=(4, 48, 100)).astype(np.float32)
    with torch.no_grad():
        full = model(torch.from_numpy(frame)[None])[0].numpy()
    plan = TilePlan(48, 100, (32, 40), halo=6, trim=3)  # trim 3 = the receptive radius
    assert plan.count > 4
    with Predictor(plan, make_runner(model, resolve_device("cpu"), workers), group) as predictor:
        merged, times = predictor(frame)
    np.testing.assert_allclose(merged, full, atol=2e-6)
    assert times.compute > 0 and times.total >= times.compute


def test_mapreduce_with_a_trim_below_the_receptive_field_shows_a_seam():
    model = _local_net()
    frame = np.random.default_rng(1).normal(size=(4, 48, 100)).astype(np.float32)
    with torch.no_grad():
        full = model(torch.from_numpy(frame)[None])[0].numpy()
    with Predictor(TilePlan(48, 100, (32, 40), halo=6, trim=0), make_runner(model, resolve_device("cpu"), 1)) as predictor:
        merged, _ = predictor(frame)
    assert np.abs(merged - full).max() > 1e-3


def test_unet_mapreduce_with_one_tile_the_whole_frame_is_full_frame():
    g = build_generator(NetConfig(size=32, ngf=8)).eval()
    frame = np.random.default_rng(2).normal(size=(4, 32, 64)).astype(np.float32)
    with torch.no_grad():
        full = g(torch.from_numpy(frame)[None])[0].numpy()
    with Predictor(TilePlan(32, 64, (32, 64), halo=8, unit=32), make_runner(g, resolve_device("cpu"), 1)) as predictor:
        merged, _ = predictor(frame)
    np.testing.assert_array_equal(merged, full)


def test_unet_tiles_are_independent_of_their_group_and_workers():
    g = build_generator(NetConfig(size=32, ngf=8)).eval()
    frame = np.random.default_rng(3).normal(size=(4, 32, 160)).astype(np.float32)
    plan = TilePlan(32, 160, (32, 64), halo=8, unit=32)
    outputs = []
    for workers, group in ((1, 1), (1, None), (2, None), (2, 2)):
        with Predictor(plan, make_runner(g, resolve_device("cpu"), workers), group) as predictor:
            outputs.append(predictor(frame)[0])
    for out in outputs[1:]:
        np.testing.assert_allclose(out, outputs[0], atol=1e-5)


def test_groups_are_padded_to_one_shape_and_unpacked():
    tiles = np.arange(5 * 2 * 3 * 3, dtype=np.float32).reshape(5, 2, 3, 3)
    groups, n = pack_groups(tiles, 2)
    assert groups.shape == (3, 2, 2, 3, 3) and n == 5
    assert not groups[2, 1].any()  # the padding tile
    np.testing.assert_array_equal(unpack_groups(groups, n), tiles)


@pytest.mark.parametrize("kwargs,message", [
    (dict(height=64, width=128, tile=(128, 64), halo=8, unit=64), "tile height 128 is larger than the frame's height 64"),
    (dict(height=64, width=256, tile=(64, 64), halo=32, unit=64), "halo 32 leaves no core"),
    (dict(height=64, width=128, tile=(64, 48), halo=8, unit=64), "tile width 48 is not a positive multiple of 64"),
    (dict(height=64, width=128, tile=(64, 64), halo=-1, unit=64), "halo -1 is negative"),
])
def test_tilings_that_cannot_cover_the_frame_are_refused(kwargs, message):
    with pytest.raises(TilingError, match=message):
        TilePlan(**kwargs)


def test_cpu_workers_restore_the_thread_count_when_closed():
    before = torch.get_num_threads()
    with Predictor(TilePlan(8, 8, (8, 8), halo=0), make_runner(_local_net(), resolve_device("cpu"), 1)):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_more_cpu_workers_than_cores_is_refused():
    with pytest.raises(ValueError, match="workers requested but this host has"):
        make_runner(_local_net(), resolve_device("cpu"), 4096)
