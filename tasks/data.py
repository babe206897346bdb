"""(frame t, frame t+k) pairs from the zarr store, split by simulation, with saved normalisation.

Training reads pairs lazily: ``PairSource`` holds only handles on each simulation's zarr arrays (one
chunk per frame) and reads the frames a batch needs when the batch is asked for; ``prefetch`` reads
the next batch on a background thread while the caller computes on the current one. Memory is a few
batches, whatever the size of the dataset.
"""

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from zarr.abc.store import Store

from tasks.errors import UserError
from tasks.store import frame_store, open_frame_arrays, open_simulation

INPUTS = ("u", "v", "p", "mask")
OUTPUTS = ("u", "v", "p")


def split_simulations(sim_ids: list[str], n_val: int, n_test: int, seed: int) -> dict[str, list[str]]:
    """Disjoint train/val/test lists of whole simulations (seeded permutation of the sorted ids)."""
    ids = sorted(sim_ids)
    if n_val + n_test >= len(ids):
        raise UserError(f"dataset has {len(ids)} simulations; holding out {n_val} for validation and {n_test} for testing leaves none to train on")
    order = np.random.default_rng(seed).permutation(len(ids))
    shuffled = [ids[i] for i in order]
    return {"test": sorted(shuffled[:n_test]), "val": sorted(shuffled[n_test : n_test + n_val]), "train": sorted(shuffled[n_test + n_val :])}


def epoch_order(n_pairs: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled pair order of one epoch: a function of (seed, epoch) only, so every rank and a
    resumed run see the same order."""
    return np.random.default_rng([seed, epoch]).permutation(n_pairs)


@dataclass
class Normalizer:
    """Affine map of the physical channels to [-1, 1] (tanh range) from training-set extremes, with
    10% headroom so a rollout can leave the training range a little; the mask maps {0, 1} -> {-1, 1}."""

    center: list[float]
    scale: list[float]

    @classmethod
    def from_range(cls, lo: np.ndarray, hi: np.ndarray) -> "Normalizer":
        """From per-channel minima and maxima (3,) of u, v, p, computed in float32."""
        lo, hi = np.asarray(lo, np.float32), np.asarray(hi, np.float32)
        return cls(center=((hi + lo) / 2).tolist(), scale=(np.maximum((hi - lo) / 2, 1e-6) * 1.1).tolist())

    @classmethod
    def fit(cls, source: "PairSource") -> "Normalizer":
        """Extremes over every frame of the source's simulations, streamed (see PairSource.channel_range)."""
        return cls.from_range(*source.channel_range())

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Physical (..., C, H, W) with C = 3 outputs or 4 inputs -> network units."""
        c = np.array(self.center, np.float32)[:, None, None]
        s = np.array(self.scale, np.float32)[:, None, None]
        out = np.empty_like(x, dtype=np.float32)
        out[..., :3, :, :] = (x[..., :3, :, :] - c) / s
        if x.shape[-3] == 4:
            out[..., 3, :, :] = 2 * x[..., 3, :, :] - 1
        return out

    def decode(self, y: np.ndarray) -> np.ndarray:
        c = np.array(self.center, np.float32)[:, None, None]
        s = np.array(self.scale, np.float32)[:, None, None]
        return y * s + c


def training_net(height: int, width: int, crop: int | None, depth: int | None = None, **widths):
    """The NetConfig a training run uses on frames of height × width: its size is the crop side, or
    the frames' shorter side when training on whole frames. UserError when the frames or the crop do
    not fit the U-Net. ``widths``: ngf, ndf, norm."""
    from models.nets import NetConfig

    side = crop or min(height, width)
    if crop and crop > min(height, width):
        raise UserError(f"crop {crop} does not fit the {height}x{width} frames; use at most {min(height, width)}")
    net = NetConfig(in_channels=len(INPUTS), out_channels=len(OUTPUTS), size=side, depth=depth, **widths)
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
    the rollout's reference; training reads through PairSource)."""
    ds = open_simulation(dataset_dir, sim_id)
    return np.stack([ds[name].values for name in INPUTS], axis=1).astype(np.float32)


class PairSource:
    """(frame t, frame t+stride) pairs of the given simulations, read lazily from the zarr store.

    Construction reads array metadata only. Pair ``j`` is ``(simulation i, frame t)`` with the pairs of
    each simulation numbered consecutively in the order of ``sim_ids``. ``store`` is the zarr store
    holding the simulation groups; the default is the dataset's local ``store.zarr``.
    """

    def __init__(self, dataset_dir: Path, sim_ids: list[str], stride: int, store: Store | None = None):
        if not sim_ids:
            raise UserError("no simulations to draw (t, t+k) pairs from")
        self.sim_ids, self.stride = list(sim_ids), stride
        store = frame_store(dataset_dir) if store is None else store
        self._arrays = [open_frame_arrays(store, s, INPUTS) for s in self.sim_ids]
        shapes = {s: a["u"].shape for s, a in zip(self.sim_ids, self._arrays)}
        grids = {shape[1:] for shape in shapes.values()}
        if len(grids) > 1:
            raise UserError(f"simulations have different grids {sorted(grids)}; a training set needs one (ny, nx)")
        self.height, self.width = grids.pop()
        counts = np.array([max(shape[0] - stride, 0) for shape in shapes.values()], dtype=np.int64)
        self._ends = np.cumsum(counts)  # pair j belongs to the first simulation i with j < ends[i]
        self._starts = self._ends - counts
        if self._ends[-1] == 0:
            raise UserError(f"no (t, t+{stride}) pairs: the simulations have too few frames for frame stride {stride}")

    def __len__(self) -> int:
        return int(self._ends[-1])

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """(simulation position, frame t) of each pair index."""
        j = np.asarray(indices, dtype=np.int64).reshape(-1)
        if j.size and (j.min() < 0 or j.max() >= len(self)):
            raise IndexError(f"pair index out of range 0..{len(self) - 1}: {j.min()}..{j.max()}")
        sim = np.searchsorted(self._ends, j, side="right")
        return sim, j - self._starts[sim]

    def physical(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """cond (B, 4, H, W) u, v, p, mask at t and target (B, 3, H, W) u, v, p at t+stride, physical
        units; reads one chunk per needed (frame, variable), each once per call."""
        sims, t = self.locate(indices)
        cond = np.empty((len(t), len(INPUTS), self.height, self.width), np.float32)  # (B, 4, H, W)
        target = np.empty((len(t), len(OUTPUTS), self.height, self.width), np.float32)  # (B, 3, H, W)
        for i in np.unique(sims):
            rows = np.flatnonzero(sims == i)
            t0, arrays = t[rows], self._arrays[i]
            frames, where = np.unique(np.concatenate([t0, t0 + self.stride]), return_inverse=True)
            for c, name in enumerate(OUTPUTS):
                block = arrays[name].oindex[frames]  # (F, H, W)
                cond[rows, c] = block[where[: len(rows)]]
                target[rows, c] = block[where[len(rows) :]]
            mask_frames, mask_where = np.unique(t0, return_inverse=True)
            cond[rows, 3] = arrays["mask"].oindex[mask_frames][mask_where]
        return cond, target

    def batch(self, indices, norm: Normalizer) -> tuple[np.ndarray, np.ndarray]:
        """cond (B, 4, H, W) and target (B, 3, H, W) in network units."""
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

    def channel_range(self, block_frames: int = 16) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel minimum and maximum (3,) float32 of u, v, p over every frame of the source's
        simulations, read ``block_frames`` frames at a time."""
        lo = np.full(len(OUTPUTS), np.inf, np.float32)
        hi = np.full(len(OUTPUTS), -np.inf, np.float32)
        for arrays in self._arrays:
            for c, name in enumerate(OUTPUTS):
                array = arrays[name]
                for start in range(0, array.shape[0], block_frames):
                    block = array[start : start + block_frames]  # (<= block_frames, H, W)
                    lo[c] = np.minimum(lo[c], block.min())
                    hi[c] = np.maximum(hi[c], block.max())
        return lo, hi
