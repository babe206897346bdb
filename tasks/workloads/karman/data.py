"""karman's data: (frame t, frame t+k) pairs from the zarr store, split by simulation, with saved normalisation.

``PairSource`` holds handles on each simulation's zarr arrays (one chunk per frame) and reads the
frames a batch needs when the batch is asked for; ``prefetch`` reads the next batch on a background
thread while the caller computes on the current one, so memory is a few batches whatever the size of
the dataset. A training set of up to ``IN_MEMORY_BYTES`` can instead be decoded once and held in
memory (``hold_in_memory``): batches are then slices of arrays, with no chunk decoded per batch.
"""

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from zarr.abc.store import Store

from models.karman.damping import damp
from models.karman.recipe import CONDITIONS
from tasks.common.config.errors import UserError
from tasks.common.stores.store import frame_store, open_frame_arrays, read_frames

INPUTS = ("u", "v", "p", "mask")  # stored with every frame
OUTPUTS = ("u", "v", "p")


def model_inputs(condition: str) -> tuple[str, ...]:
    """The input channels of a model trained with ``condition``: the stored inputs, then the condition's."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; choose {' or '.join(CONDITIONS)}")
    return INPUTS + (("reynolds",) if condition == "reynolds" else ())


def with_condition(frames: np.ndarray, reynolds: float | None) -> np.ndarray:
    """Frames (..., 4, H, W) with the Reynolds number appended as a constant channel (..., 5, H, W); unchanged for None."""
    if reynolds is None:
        return frames
    extra = np.full(frames.shape[:-3] + (1,) + frames.shape[-2:], reynolds, np.float32)
    return np.concatenate([frames, extra], axis=-3)


def split_simulations(sim_ids: list[str], n_val: int, n_test: int, seed: int,
                      reynolds: dict[str, float] | None = None) -> dict[str, list[str]]:
    """Disjoint train/val/test lists of whole simulations.

    With ``reynolds`` (each simulation's Reynolds number), held-out simulations are taken inside the
    sweep's range: the lowest and highest Reynolds numbers always train, test simulations are spread
    evenly over the interior (the middle one for a single test), then validation over what is left of
    it; so rollouts on them interpolate in Re. Without, or when the interior is too small, a seeded
    permutation of the sorted ids."""
    ids = sorted(sim_ids)
    if n_val + n_test >= len(ids):
        raise UserError(f"dataset has {len(ids)} simulations; holding out {n_val} for validation and {n_test} for testing leaves none to train on")
    if reynolds is not None:
        by_re = sorted(ids, key=lambda s: (reynolds[s], s))
        lo, hi = reynolds[by_re[0]], reynolds[by_re[-1]]
        interior = [s for s in by_re if lo < reynolds[s] < hi]
        if len(interior) >= n_val + n_test:
            test = _spread(interior, n_test)
            val = _spread([s for s in interior if s not in test], n_val)
            return {"test": sorted(test), "val": sorted(val), "train": sorted(s for s in ids if s not in test and s not in val)}
    order = np.random.default_rng(seed).permutation(len(ids))
    shuffled = [ids[i] for i in order]
    return {"test": sorted(shuffled[:n_test]), "val": sorted(shuffled[n_test : n_test + n_val]), "train": sorted(shuffled[n_test + n_val :])}


def _spread(items: list, n: int) -> list:
    """``n`` items evenly spread over the list (the middle of n equal parts)."""
    return [items[int((i + 0.5) * len(items) / n)] for i in range(n)]


def split_of(manifest: dict, n_val: int, n_test: int, seed: int) -> dict[str, list[str]]:
    """The train/val/test split of a dataset's manifest (interpolating in Reynolds number)."""
    sims = manifest["simulations"]
    return split_simulations(list(sims), n_val, n_test, seed, {s: float(v["spec"]["reynolds"]) for s, v in sims.items()})


IN_MEMORY_BYTES = 2 * 2**30  # training sets up to this size (per process) are held in memory


@dataclass
class Normalizer:
    """Affine map of the physical channels to [-1, 1] (tanh range) from training-set extremes, with
    10% headroom so a rollout can leave the training range a little; the mask maps {0, 1} -> {-1, 1};
    ``reynolds`` (centre, scale), for a model conditioned on it, maps the training simulations'
    Reynolds numbers onto [-1, 1] (a simulation outside their range lands outside it)."""

    center: list[float]
    scale: list[float]
    reynolds: list[float] | None = None

    @classmethod
    def from_range(cls, lo: np.ndarray, hi: np.ndarray) -> "Normalizer":
        """From per-channel minima and maxima (3,) of u, v, p, computed in float32."""
        lo, hi = np.asarray(lo, np.float32), np.asarray(hi, np.float32)
        return cls(center=((hi + lo) / 2).tolist(), scale=(np.maximum((hi - lo) / 2, 1e-6) * 1.1).tolist())

    @classmethod
    def fit(cls, source: "PairSource") -> "Normalizer":
        """Extremes over every frame of the source's simulations, streamed (see PairSource.channel_range),
        and the range of their Reynolds numbers when the source carries them."""
        norm = cls.from_range(*source.channel_range())
        if source.reynolds is not None:
            lo, hi = min(source.reynolds), max(source.reynolds)
            norm.reynolds = [(hi + lo) / 2, max((hi - lo) / 2, 1.0)]
        return norm

    @property
    def input_channels(self) -> int:
        return 4 + (self.reynolds is not None)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Physical (..., C, H, W) with C = the model's inputs (u, v, p, mask[, reynolds]) or 3·n outputs
        (n states of u, v, p one after another) -> network units."""
        channels, inputs = x.shape[-3], self.input_channels
        if channels != inputs and (channels % 3 or channels in (4, 5)):
            raise ValueError(f"{channels} channels: expected {inputs} (u, v, p, mask{', reynolds' if inputs == 5 else ''}) "
                             "or a multiple of 3 (u, v, p states)")
        reps = 1 if channels == inputs else channels // 3
        c = np.tile(np.array(self.center, np.float32), reps)[:, None, None]
        s = np.tile(np.array(self.scale, np.float32), reps)[:, None, None]
        out = np.empty_like(x, dtype=np.float32)
        n = 3 * reps
        out[..., :n, :, :] = (x[..., :n, :, :] - c) / s
        if channels == inputs:
            out[..., 3, :, :] = 2 * x[..., 3, :, :] - 1
            if self.reynolds is not None:
                out[..., 4, :, :] = (x[..., 4, :, :] - self.reynolds[0]) / self.reynolds[1]
        return out

    def decode(self, y: np.ndarray) -> np.ndarray:
        c = np.array(self.center, np.float32)[:, None, None]
        s = np.array(self.scale, np.float32)[:, None, None]
        return y * s + c


@dataclass
class StepCodec:
    """How a network output becomes the next state. ``delta_scale`` None: the output is the next state
    in the normaliser's units; otherwise the output is the change x(t+k) - x(t) in units of its
    per-channel RMS ``delta_scale`` (physical units) over the training pairs, its highest wavenumbers
    damped by ``damping`` (models.karman.damping) before it is added. ``constrain``: the model was trained with
    the rollout's constraints in its unrolled chain, the inlet's held among them, so its rollouts hold the
    inlet too."""

    norm: Normalizer
    delta_scale: list[float] | None = None
    damping: float = 0.0
    constrain: bool = False

    @classmethod
    def from_meta(cls, meta: dict) -> "StepCodec":
        """From a model's meta.json (models saved before delta prediction predict the state)."""
        delta = meta.get("predict") == "delta"
        return cls(Normalizer(**meta["normalizer"]), meta.get("delta_scale") if delta else None, meta.get("damping", 0.0) if delta else 0.0,
                   bool(meta.get("constrain", False)))

    @property
    def zero(self) -> list[float]:
        """u = v = p = 0 in network units, per channel (what the constraints impose inside the obstacle): the encoding of a zero state."""
        return self.norm.encode(np.zeros((3, 1, 1), np.float32)).ravel().tolist()

    @property
    def delta_ratio(self) -> list[float] | None:
        """Network units of the change -> network units of the state, per channel (the trainer's)."""
        if self.delta_scale is None:
            return None
        return [d / s for d, s in zip(self.delta_scale, self.norm.scale)]

    def next_state(self, state: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Physical state (..., 3 or 4, H, W) at t and network output (..., 3, H, W) -> physical (..., 3, H, W) at t+k."""
        if self.delta_scale is None:
            return self.norm.decode(out)
        return state[..., :3, :, :] + damp(out, self.damping) * np.array(self.delta_scale, np.float32)[:, None, None]


def training_net(height: int, width: int, crop: int | None, depth: int | None = None, in_channels: int = len(INPUTS), **widths):
    """The NetConfig a training run uses on frames of height × width: its size is the crop side, or
    the frames' shorter side when training on whole frames. UserError when the frames or the crop do
    not fit the U-Net. ``widths``: ngf, ndf, norm, and the recipe's dropout, upsample and output."""
    from models.karman.nets.config import NetConfig

    side = crop or min(height, width)
    if crop and crop > min(height, width):
        raise UserError(f"crop {crop} does not fit the {height}x{width} frames; use at most {min(height, width)}")
    net = NetConfig(in_channels=in_channels, out_channels=len(OUTPUTS), size=side, depth=depth, **widths)
    try:
        net.check_image(*((crop, crop) if crop else (height, width)))
    except ValueError as exc:
        raise UserError(f"crop {crop}: {exc}" if crop else str(exc)) from None
    return net


def crop_offsets(batch_size: int, height: int, width: int, side: int, seed: int, epoch: int, step: int) -> np.ndarray:
    """(B, 2) top-left corners of one batch's random side × side crops: a function of (seed, epoch,
    step) only, so every rank (each taking its slice of the global batch) and a resumed run agree."""
    rng = np.random.default_rng([seed, epoch, step, 1])
    return np.stack([rng.integers(0, height - side + 1, batch_size), rng.integers(0, width - side + 1, batch_size)], axis=1)


def crop_pairs(cond: np.ndarray, target: np.ndarray, corners: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Crops (B, C, side, side) of cond and target, sample i at corners[i] = (row, column)."""
    def take(x: np.ndarray) -> np.ndarray:  # (B, C, H, W) -> (B, C, side, side)
        return np.stack([x[i, :, r:r + side, q:q + side] for i, (r, q) in enumerate(corners)])
    return take(cond), take(target)


def load_frames(dataset_dir: Path, sim_id: str) -> np.ndarray:
    """All frames of one simulation as (T, 4, H, W) float32: u, v, p, mask (one simulation only:
    the rollout's reference; training reads through PairSource). Damaged data is refused, naming it."""
    arrays = open_frame_arrays(frame_store(dataset_dir), sim_id, INPUTS)
    return np.stack([read_frames(arrays[name], slice(None), dataset_dir, sim_id, name) for name in INPUTS], axis=1).astype(np.float32)


class PairSource:
    """(frame t, frame t+stride) pairs of the given simulations, read from the zarr store as batches ask
    for them, or from memory after ``hold_in_memory``.

    Construction reads array metadata only. Pair ``j`` is ``(simulation i, frame t)`` with the pairs of
    each simulation numbered consecutively in the order of ``sim_ids``. ``store`` is the zarr store
    holding the simulation groups; the default is the dataset's local ``store.zarr``. ``reynolds``
    (one per simulation): the inputs carry it as a fifth, constant channel (a conditioned model's).
    """

    def __init__(self, dataset_dir: Path, sim_ids: list[str], stride: int, store: Store | None = None, unroll: int = 1,
                 reynolds: list[float] | None = None):
        if not sim_ids:
            raise UserError("no simulations to draw (t, t+k) pairs from")
        if reynolds is not None and len(reynolds) != len(sim_ids):
            raise ValueError(f"{len(reynolds)} Reynolds numbers for {len(sim_ids)} simulations")
        self.sim_ids, self.stride, self.unroll = list(sim_ids), stride, unroll
        self.reynolds = None if reynolds is None else [float(r) for r in reynolds]
        self.channels = len(INPUTS) + (reynolds is not None)
        self.dataset_dir = Path(dataset_dir)
        self.in_memory = False
        store = frame_store(dataset_dir) if store is None else store
        self._arrays = [open_frame_arrays(store, s, INPUTS) for s in self.sim_ids]
        shapes = {s: a["u"].shape for s, a in zip(self.sim_ids, self._arrays)}
        grids = {shape[1:] for shape in shapes.values()}
        if len(grids) > 1:
            raise UserError(f"simulations have different grids {sorted(grids)}; a training set needs one (ny, nx)")
        self.height, self.width = grids.pop()
        counts = np.array([max(shape[0] - stride * unroll, 0) for shape in shapes.values()], dtype=np.int64)
        self._ends = np.cumsum(counts)  # pair j belongs to the first simulation i with j < ends[i]
        self._starts = self._ends - counts
        if self._ends[-1] == 0:
            raise UserError(f"no (t, t+{stride}) pairs: the simulations have too few frames for frame stride {stride}"
                            + (f" unrolled over {unroll} steps" if unroll > 1 else ""))

    def __len__(self) -> int:
        return int(self._ends[-1])

    @property
    def nbytes(self) -> int:
        """Bytes of every frame of the source's simulations (u, v, p, mask) as float32."""
        return sum(int(np.prod(a["u"].shape)) * len(INPUTS) * 4 for a in self._arrays)

    def hold_in_memory(self) -> None:
        """Read every frame of the source's simulations once and serve batches from memory from now on:
        no chunk is decoded per batch (on a CPU that decoding competes with training for the cores)."""
        self._arrays = [{name: read_frames(a[name], slice(None), self.dataset_dir, sim, name).astype(np.float32) for name in INPUTS}
                        for sim, a in zip(self.sim_ids, self._arrays)]
        self.in_memory = True

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """(simulation position, frame t) of each pair index."""
        j = np.asarray(indices, dtype=np.int64).reshape(-1)
        if j.size and (j.min() < 0 or j.max() >= len(self)):
            raise IndexError(f"pair index out of range 0..{len(self) - 1}: {j.min()}..{j.max()}")
        sim = np.searchsorted(self._ends, j, side="right")
        return sim, j - self._starts[sim]

    def physical(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """cond (B, 4 or 5, H, W) u, v, p, mask (and the simulation's Reynolds number) at t and target
        (B, 3·unroll, H, W) u, v, p at t+stride, ..., t+unroll·stride, physical units; reads one chunk per
        needed (frame, variable), each once per call."""
        sims, t = self.locate(indices)
        n_out = len(OUTPUTS)
        cond = np.empty((len(t), self.channels, self.height, self.width), np.float32)  # (B, 4 or 5, H, W)
        target = np.empty((len(t), n_out * self.unroll, self.height, self.width), np.float32)  # (B, 3·unroll, H, W)
        for i in np.unique(sims):
            rows = np.flatnonzero(sims == i)
            t0, arrays = t[rows], self._arrays[i]
            wanted = np.concatenate([t0 + j * self.stride for j in range(self.unroll + 1)])  # (unroll + 1)·R frames
            frames, where = np.unique(wanted, return_inverse=True)
            where = where.reshape(self.unroll + 1, len(rows))
            for c, name in enumerate(OUTPUTS):
                block = self._frames(i, name, frames)  # (F, H, W)
                cond[rows, c] = block[where[0]]
                for j in range(1, self.unroll + 1):
                    target[rows, (j - 1) * n_out + c] = block[where[j]]
            mask_frames, mask_where = np.unique(t0, return_inverse=True)
            cond[rows, 3] = self._frames(i, "mask", mask_frames)[mask_where]
            if self.reynolds is not None:
                cond[rows, 4] = self.reynolds[i]
        return cond, target

    def _frames(self, i: int, name: str, frames: np.ndarray) -> np.ndarray:
        """Frames (F, H, W) of variable ``name`` of simulation ``i``: from memory (checked when read), or
        from the store (one chunk each), checked."""
        array = self._arrays[i][name]
        if isinstance(array, np.ndarray):
            return array[frames]
        return read_frames(array, frames, self.dataset_dir, self.sim_ids[i], name)

    def batch(self, indices, norm: Normalizer) -> tuple[np.ndarray, np.ndarray]:
        """cond (B, 4 or 5, H, W) and target (B, 3·unroll, H, W) in network units."""
        cond, target = self.physical(indices)
        return norm.encode(cond), norm.encode(target)

    def batches(self, index_batches: Iterable, norm: Normalizer) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The batches one after another, each read when asked for (no background reads)."""
        for indices in index_batches:
            yield self.batch(indices, norm)

    def prefetch(self, index_batches: Iterable, norm: Normalizer) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The same batches in the same order, the next one read on a background thread while the caller
        works on the current one (double buffering: at most two batches exist at a time). Close the
        iterator when leaving early; an error while reading is raised where that batch is taken."""
        pending_indices = iter(index_batches)
        first = next(pending_indices, None)
        if first is None:
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pair-prefetch") as pool:
            pending = pool.submit(self.batch, first, norm)
            try:
                for indices in pending_indices:
                    ready = pending.result()
                    pending = pool.submit(self.batch, indices, norm)
                    yield ready
                yield pending.result()
            finally:
                pending.cancel()

    def change_rms(self, block_frames: int = 16) -> np.ndarray:
        """Per-channel RMS (3,) float32 of the change x(t+stride) - x(t) of u, v, p over every pair
        of the source's simulations, read ``block_frames`` frames at a time."""
        total, count = np.zeros(len(OUTPUTS)), 0
        for i, arrays in enumerate(self._arrays):
            frames = arrays[OUTPUTS[0]].shape[0]
            for start in range(0, frames - self.stride, block_frames):
                stop = min(start + block_frames, frames - self.stride)
                for c, name in enumerate(OUTPUTS):
                    block = self._frames(i, name, np.arange(start, stop + self.stride))  # (stop - start + stride, H, W)
                    change = block[self.stride :].astype(np.float64) - block[: -self.stride]
                    total[c] += np.square(change).sum()
                count += (stop - start) * self.height * self.width
        return np.sqrt(total / max(count, 1)).astype(np.float32)

    def channel_range(self, block_frames: int = 16) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel minimum and maximum (3,) float32 of u, v, p over every frame of the source's
        simulations, read ``block_frames`` frames at a time."""
        lo = np.full(len(OUTPUTS), np.inf, np.float32)
        hi = np.full(len(OUTPUTS), -np.inf, np.float32)
        for i, arrays in enumerate(self._arrays):
            for c, name in enumerate(OUTPUTS):
                count = arrays[name].shape[0]
                for start in range(0, count, block_frames):
                    block = self._frames(i, name, np.arange(start, min(start + block_frames, count)))  # (<= block_frames, H, W)
                    lo[c] = np.minimum(lo[c], block.min())
                    hi[c] = np.maximum(hi[c], block.max())
        return lo, hi



