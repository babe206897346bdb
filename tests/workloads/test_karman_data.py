"""The lazy pair loader against real zarr stores written by the simulation task on tiny grids."""

import json
import threading
import time

import numpy as np
import pytest
from zarr.abc.store import RangeByteRequest
from zarr.storage import LocalStore, WrapperStore

from tasks.common.config.errors import UserError
from tasks.common.stores.store import STORE
from tasks.workloads.karman.simulate import run_simulation
from tasks.workloads.karman.data import OUTPUTS, Normalizer, PairSource, StepCodec, load_frames, model_inputs, split_simulations, with_condition
from tests.tasks.common.test_store import tiny_spec

# Uneven frame counts, so that pair numbering across simulations is exercised.
FRAMES = {20.0: 6, 24.0: 5, 28.0: 7, 32.0: 6, 36.0: 4}
FRAMES_OF = {tiny_spec(reynolds=re, frames=n).sim_id: n for re, n in FRAMES.items()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A dataset folder with five tiny simulations; returns (folder, sorted simulation ids)."""
    root = tmp_path_factory.mktemp("dataset")
    ids = [run_simulation(str(root), tiny_spec(reynolds=re, frames=n, backend="numpy"))["sim_id"] for re, n in FRAMES.items()]
    return root, sorted(ids)


@pytest.fixture(scope="module")
def eager(dataset):
    """Every frame of every simulation, loaded whole: {sim_id: (T, 4, H, W)}."""
    root, ids = dataset
    return {s: load_frames(root, s) for s in ids}


def eager_pairs(frames: list[np.ndarray], stride: int, indices) -> tuple[np.ndarray, np.ndarray]:
    """The reference: pairs numbered simulation by simulation, frames stacked from whole arrays."""
    pairs = [(i, t) for i, f in enumerate(frames) for t in range(len(f) - stride)]
    cond = np.stack([frames[pairs[j][0]][pairs[j][1]] for j in indices])
    target = np.stack([frames[pairs[j][0]][pairs[j][1] + stride, :3] for j in indices])
    return cond, target


def eager_normalizer(frames: list[np.ndarray]) -> Normalizer:
    stacked = np.concatenate([f[:, : len(OUTPUTS)] for f in frames])  # (N, 3, H, W)
    lo, hi = stacked.min(axis=(0, 2, 3)), stacked.max(axis=(0, 2, 3))
    return Normalizer(center=((hi + lo) / 2).tolist(), scale=(np.maximum((hi - lo) / 2, 1e-6) * 1.1).tolist())


class KeyLog(WrapperStore):
    """A read-only local store that records every read through it, as (key, byte range) (the list is
    shared by the copies zarr makes of the store)."""

    def __init__(self, store, keys=None):
        super().__init__(store)
        self.keys = [] if keys is None else keys

    def _with_store(self, store):
        return type(self)(store, self.keys)

    async def get(self, key, prototype, byte_range=None):
        self.keys.append((key, byte_range))
        return await self._store.get(key, prototype, byte_range)

    async def get_partial_values(self, prototype, key_ranges):
        key_ranges = list(key_ranges)
        self.keys.extend(key_ranges)
        return await self._store.get_partial_values(prototype, key_ranges)

    async def _get_many(self, requests):
        requests = list(requests)
        self.keys.extend((k, r) for k, _, r in requests)
        async for item in self._store._get_many(requests):
            yield item

    def frame_reads(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(simulation, variable, frames) of every read of frame data so far: a byte range of a shard
        file is the frame whose chunk starts there (found in the shard's index), a whole shard file all
        of its frames; reads of a shard's index (its last bytes) are left out."""
        reads = []
        for key, byte_range in self.keys:
            if "/c/" not in key:
                continue
            sim, name, _, shard_number = key.split("/")[:4]
            meta = json.loads((self._store.root / sim / name / "zarr.json").read_text())
            per_shard = meta["chunk_grid"]["configuration"]["chunk_shape"][0]
            frames = np.arange(int(shard_number) * per_shard, min((int(shard_number) + 1) * per_shard, meta["shape"][0]))
            if byte_range is None:
                reads.append((sim, name, tuple(frames.tolist())))
            elif isinstance(byte_range, RangeByteRequest):
                index = np.frombuffer((self._store.root / key).read_bytes()[-(16 * per_shard + 4):-4], dtype="<u8").reshape(per_shard, 2)
                reads.append((sim, name, tuple(frames[index[: len(frames), 0] == byte_range.start].tolist())))
        return reads

    def chunk_reads(self) -> set[tuple[str, str, int]]:
        """(simulation, variable, frame) of every frame read so far."""
        return {(sim, name, frame) for sim, name, frames in self.frame_reads() for frame in frames}


def logged_store(root) -> KeyLog:
    return KeyLog(LocalStore(root / STORE, read_only=True))


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_lazy_batches_equal_eager_stacking(dataset, eager, stride):
    root, ids = dataset
    source = PairSource(root, ids, stride)
    frames = [eager[s] for s in ids]
    assert len(source) == sum(len(f) - stride for f in frames)
    assert (source.height, source.width) == frames[0].shape[-2:]
    norm = eager_normalizer(frames)
    rng = np.random.default_rng(stride)
    for indices in (rng.permutation(len(source)), rng.integers(0, len(source), 9), np.array([0, 0, len(source) - 1])):
        cond, target = eager_pairs(frames, stride, indices)
        lazy_cond, lazy_target = source.physical(indices)
        assert lazy_cond.dtype == np.float32 and lazy_cond.shape == (len(indices), 4, *frames[0].shape[-2:])
        np.testing.assert_array_equal(lazy_cond, cond)
        np.testing.assert_array_equal(lazy_target, target)
        net_cond, net_target = source.batch(indices, norm)
        np.testing.assert_array_equal(net_cond, norm.encode(cond))
        np.testing.assert_array_equal(net_target, norm.encode(target))


def test_split_never_shares_a_simulation(dataset, eager):
    root, ids = dataset
    for seed in range(6):
        split = split_simulations(ids, n_val=1, n_test=2, seed=seed)
        parts = [set(split[k]) for k in ("train", "val", "test")]
        assert [len(p) for p in parts] == [2, 1, 2]
        assert set().union(*parts) == set(ids)
        assert all(not (a & b) for i, a in enumerate(parts) for b in parts[i + 1 :])
        # The sources built from the split serve frames of their own simulations only.
        served = {}
        for name in ("train", "val", "test"):
            source = PairSource(root, split[name], 1)
            cond, target = source.physical(np.arange(len(source)))
            served[name] = {f.tobytes() for f in np.concatenate([cond[:, :3], target])}
            own = {f.tobytes() for s in split[name] for f in eager[s][:, :3]}
            assert served[name] <= own
        assert not (served["train"] & served["test"]) and not (served["train"] & served["val"])


@pytest.mark.parametrize("block_frames", [1, 2, 16])
def test_streaming_normalizer_equals_eager_extremes(dataset, eager, block_frames):
    root, ids = dataset
    train = split_simulations(ids, n_val=0, n_test=1, seed=0)["train"]
    frames = [eager[s] for s in train]
    stacked = np.concatenate([f[:, :3] for f in frames])  # (N, 3, H, W)
    lo, hi = PairSource(root, train, 1).channel_range(block_frames)
    np.testing.assert_array_equal(lo, stacked.min(axis=(0, 2, 3)))
    np.testing.assert_array_equal(hi, stacked.max(axis=(0, 2, 3)))
    assert Normalizer.fit(PairSource(root, train, 1)) == eager_normalizer(frames)


def test_prefetch_yields_the_same_batches_in_the_same_order(dataset, eager):
    root, ids = dataset
    source = PairSource(root, ids, 1)
    norm = eager_normalizer(list(eager.values()))
    order = np.random.default_rng(0).permutation(len(source))
    index_batches = [order[i : i + 4] for i in range(0, len(order), 4)]  # the last one is shorter
    sync = list(source.batches(index_batches, norm))
    ahead = list(source.prefetch(iter(index_batches), norm))
    assert len(ahead) == len(sync) == len(index_batches)
    for (c1, t1), (c2, t2) in zip(sync, ahead):
        np.testing.assert_array_equal(c1, c2)
        np.testing.assert_array_equal(t1, t2)
    assert list(source.prefetch([], norm)) == []


def test_prefetch_reads_the_next_batch_in_the_background(dataset):
    root, ids = dataset
    store = logged_store(root)
    source = PairSource(root, ids, 1, store=store)
    norm = Normalizer(center=[0.0] * 3, scale=[1.0] * 3)
    first, second = np.array([0, 1]), np.array([len(source) - 1])
    (sim,), (t,) = source.locate(second)
    second_chunks = {(ids[sim], name, int(t)) for name in ("u", "v", "p", "mask")}

    batches = source.batches([first, second], norm)
    next(batches)
    time.sleep(0.2)
    assert not second_chunks & store.chunk_reads(), "the synchronous path read ahead"

    store.keys.clear()
    batches = source.prefetch([first, second], norm)
    next(batches)  # the consumer now holds batch 1; batch 2 is read meanwhile
    deadline = time.monotonic() + 10
    while not second_chunks <= store.chunk_reads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert second_chunks <= store.chunk_reads(), "batch 2 was not read while batch 1 was in use"
    next(batches)
    batches.close()


def test_prefetch_stops_its_reader_and_reports_read_errors(dataset):
    root, ids = dataset
    source = PairSource(root, ids, 1)
    norm = Normalizer(center=[0.0] * 3, scale=[1.0] * 3)
    batches = source.prefetch([np.array([0])] * 50, norm)
    next(batches)
    batches.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("pair-prefetch")]
    bad = source.prefetch([np.array([0]), np.array([len(source)])], norm)
    next(bad)
    with pytest.raises(IndexError, match="out of range"):
        next(bad)


def test_constructing_reads_no_frames_and_a_batch_reads_only_its_own(dataset):
    root, ids = dataset
    store = logged_store(root)
    source = PairSource(root, ids, 2, store=store)
    assert len(source) > 0 and store.keys, "construction read the metadata through the store"
    assert store.frame_reads() == []

    sim, t = source.locate([3, 4, 9])
    source.physical([3, 4, 9])
    expected = set()
    for i, t0 in zip(sim, t):
        expected |= {(ids[i], name, int(t0)) for name in ("u", "v", "p", "mask")}
        expected |= {(ids[i], name, int(t0) + 2) for name in ("u", "v", "p")}
    reads = store.frame_reads()
    assert {(s, name) for s, name, _ in reads} == {(s, name) for s, name, _ in expected}  # no other variable or simulation
    assert expected <= store.chunk_reads()
    assert len(reads) == len({(s, name, frames) for s, name, frames in reads}), "a chunk was read twice for one batch"
    for s, name, frames in reads:
        # each frame asked for read as its own chunk, or the whole shard in one read when they fill a quarter of it
        asked = {f for s2, n2, f in expected if (s2, n2) == (s, name)}
        assert len(frames) == 1 or (len(frames) == FRAMES_OF[s] and 4 * len(asked) >= len(frames)), (s, name, frames, asked)


def test_bad_sources_are_clear_errors(dataset):
    root, ids = dataset
    with pytest.raises(UserError, match="'circle-re99-missing' is missing"):
        PairSource(root, [ids[0], "circle-re99-missing"], 1)
    with pytest.raises(UserError, match="too few frames for frame stride 9"):
        PairSource(root, ids, 9)


def test_crops_are_the_slices_at_their_corners():
    from tasks.workloads.karman.data import crop_pairs

    rng = np.random.default_rng(0)
    cond, target = rng.normal(size=(3, 4, 10, 14)).astype(np.float32), rng.normal(size=(3, 3, 10, 14)).astype(np.float32)
    corners = np.array([[0, 0], [2, 7], [6, 10]])
    c, t = crop_pairs(cond, target, corners, 4)
    assert c.shape == (3, 4, 4, 4) and t.shape == (3, 3, 4, 4) and c.flags.c_contiguous
    for i, (r, q) in enumerate(corners):
        np.testing.assert_array_equal(c[i], cond[i, :, r:r + 4, q:q + 4])
        np.testing.assert_array_equal(t[i], target[i, :, r:r + 4, q:q + 4])


def test_crop_corners_depend_on_seed_epoch_and_step_only_and_cover_the_frame():
    from tasks.workloads.karman.data import crop_offsets

    a = crop_offsets(8, 32, 64, 16, seed=3, epoch=2, step=5)
    np.testing.assert_array_equal(a, crop_offsets(8, 32, 64, 16, seed=3, epoch=2, step=5))
    assert not np.array_equal(a, crop_offsets(8, 32, 64, 16, seed=3, epoch=2, step=6))
    many = np.concatenate([crop_offsets(8, 32, 64, 16, 0, 1, s) for s in range(200)])
    assert many[:, 0].min() == 0 and many[:, 0].max() == 32 - 16
    assert many[:, 1].min() == 0 and many[:, 1].max() == 64 - 16


def test_the_training_network_follows_the_crop_and_refuses_what_does_not_fit():
    from tasks.workloads.karman.data import training_net

    assert training_net(32, 64, None).size == 32 and training_net(32, 64, None).generator_depth == 5
    net = training_net(64, 128, 32, ngf=8, ndf=8)
    assert (net.size, net.generator_depth, net.ngf) == (32, 5, 8)
    with pytest.raises(UserError, match="crop 96 does not fit the 64x128 frames; use at most 64"):
        training_net(64, 128, 96)
    with pytest.raises(UserError, match="crop 48: image size 48x48 does not fit a U-Net of depth 5"):
        training_net(64, 128, 48)


def test_held_out_simulations_lie_inside_the_reynolds_range():
    ids = [f"sim-{re}" for re in (70, 80, 90, 100, 110, 120, 130, 140, 150)]
    reynolds = {s: float(s.split("-")[1]) for s in ids}
    split = split_simulations(ids, n_val=1, n_test=1, seed=0, reynolds=reynolds)
    assert split["test"] == ["sim-110"] and split["val"] == ["sim-120"]  # the middle, then the middle of the rest
    assert {"sim-70", "sim-150"} <= set(split["train"]) and len(split["train"]) == 7
    wide = split_simulations(ids, n_val=2, n_test=3, seed=0, reynolds=reynolds)
    held = wide["test"] + wide["val"]
    assert len(set(held)) == 5 and all(80 <= reynolds[s] <= 140 for s in held)
    # Too few interior simulations: the seeded permutation, as without Reynolds numbers.
    three = ids[:3]
    assert split_simulations(three, 1, 1, 0, {s: reynolds[s] for s in three}) == split_simulations(three, 1, 1, 0)


@pytest.mark.parametrize("in_memory", [False, True], ids=["read-per-batch", "held-in-memory"])
@pytest.mark.parametrize("stride,unroll", [(1, 2), (2, 2), (1, 3)])
def test_unrolled_targets_are_the_next_states_one_after_another(dataset, eager, stride, unroll, in_memory):
    root, ids = dataset
    frames = [eager[s] for s in ids]
    source = PairSource(root, ids, stride, unroll=unroll)
    assert source.nbytes == sum(f.size for f in frames) * 4
    if in_memory:
        zarr_rms, zarr_range = source.change_rms(), source.channel_range()
        source.hold_in_memory()
        assert source.in_memory
        np.testing.assert_array_equal(source.change_rms(), zarr_rms)
        for a, b in zip(source.channel_range(), zarr_range):
            np.testing.assert_array_equal(a, b)
    pairs = [(i, t) for i, f in enumerate(frames) for t in range(len(f) - stride * unroll)]
    assert len(source) == len(pairs)
    picks = np.arange(len(source))[::2]
    cond, target = source.physical(picks)
    assert target.shape == (len(picks), 3 * unroll, *frames[0].shape[-2:])
    for row, j in enumerate(picks):
        i, t = pairs[j]
        np.testing.assert_array_equal(cond[row], frames[i][t])
        for n in range(1, unroll + 1):
            np.testing.assert_array_equal(target[row, 3 * (n - 1) : 3 * n], frames[i][t + n * stride, :3])
    norm = eager_normalizer(frames)
    _, encoded = source.batch(picks, norm)
    np.testing.assert_allclose(encoded[:, 3:6], norm.encode(target[:, 3:6]), rtol=0, atol=0)


@pytest.mark.parametrize("block_frames", [1, 3, 16])
def test_change_rms_is_the_rms_of_every_pairs_change(dataset, eager, block_frames):
    root, ids = dataset
    for stride in (1, 2):
        changes = np.concatenate([(eager[s][stride:, :3] - eager[s][:-stride, :3]).astype(np.float64) for s in ids])
        expected = np.sqrt(np.mean(np.square(changes), axis=(0, 2, 3)))
        np.testing.assert_allclose(PairSource(root, ids, stride).change_rms(block_frames), expected, rtol=1e-5)


def test_step_codec_adds_the_decoded_change_to_the_state():
    norm = Normalizer(center=[0.05, 0.0, 0.3], scale=[0.1, 0.05, 0.01])
    codec = StepCodec(norm, delta_scale=[0.002, 0.004, 0.0001])
    state = np.random.default_rng(0).normal(size=(4, 8, 8)).astype(np.float32)
    out = np.ones((3, 8, 8), np.float32)
    np.testing.assert_allclose(codec.next_state(state, out) - state[:3], np.broadcast_to(np.array([0.002, 0.004, 0.0001], np.float32)[:, None, None], (3, 8, 8)), rtol=0, atol=1e-6)
    assert codec.delta_ratio == pytest.approx([0.02, 0.08, 0.01])
    plain = StepCodec.from_meta({"normalizer": {"center": norm.center, "scale": norm.scale}})  # a model from before delta prediction
    assert plain.delta_scale is None
    np.testing.assert_allclose(plain.next_state(state, out), norm.decode(out))


def test_a_reynolds_condition_is_a_fifth_constant_channel_mapped_onto_the_training_range(dataset, eager):
    """A source given each simulation's Reynolds number carries it as a fifth input channel; the normaliser maps the
    training range onto [-1, 1] (beyond it for a simulation outside), and refuses inputs without the channel."""
    root, ids = dataset
    reynolds = [float(re) for re in sorted(FRAMES)]  # ids sort as their Reynolds numbers do (tiny_spec's names)
    source = PairSource(root, ids, 1, unroll=2, reynolds=reynolds)
    assert source.channels == 5
    plain = PairSource(root, ids, 1, unroll=2)
    picks = np.arange(len(source))
    cond, target = source.physical(picks)
    plain_cond, plain_target = plain.physical(picks)
    np.testing.assert_array_equal(cond[:, :4], plain_cond)
    np.testing.assert_array_equal(target, plain_target)
    sims, _ = source.locate(picks)
    np.testing.assert_array_equal(cond[:, 4], np.broadcast_to(np.array(reynolds, np.float32)[sims][:, None, None], cond[:, 4].shape))
    norm = Normalizer.fit(source)
    assert norm.reynolds == [28.0, 8.0] and Normalizer.fit(plain).reynolds is None
    encoded, _ = source.batch(picks, norm)
    assert encoded[:, 4].min() == -1.0 and encoded[:, 4].max() == 1.0
    np.testing.assert_array_equal(encoded[:, :4], plain.batch(picks, Normalizer(norm.center, norm.scale))[0])
    outside = with_condition(eager[ids[0]], 44.0)  # (T, 5, H, W): Re 44, beyond the range's top
    assert outside.shape[1] == 5 and np.all(norm.encode(outside)[:, 4] == 2.0)
    with pytest.raises(ValueError, match="4 channels: expected 5 \\(u, v, p, mask, reynolds\\)"):
        norm.encode(plain_cond)
    with pytest.raises(ValueError, match="2 Reynolds numbers for 5 simulations"):
        PairSource(root, ids, 1, reynolds=[1.0, 2.0])
    assert model_inputs("reynolds") == ("u", "v", "p", "mask", "reynolds") and model_inputs("none") == ("u", "v", "p", "mask")


def test_the_codecs_zero_is_a_zero_state_in_network_units():
    codec = StepCodec(Normalizer(center=[0.05, 0.0, -0.01], scale=[0.2, 0.1, 0.02]), constrain=True)
    assert codec.zero == pytest.approx([-0.25, 0.0, 0.5])
    np.testing.assert_allclose(codec.norm.decode(np.array(codec.zero, np.float32)[:, None, None]), 0.0, atol=1e-7)
