"""(frame t, frame t+k) pairs from the zarr store, split by simulation, with saved normalisation."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.errors import UserError
from tasks.store import open_simulation

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


@dataclass
class Normalizer:
    """Affine map of the physical channels to [-1, 1] (tanh range) from training-set extremes, with
    10% headroom so a rollout can leave the training range a little; the mask maps {0, 1} -> {-1, 1}."""

    center: list[float]
    scale: list[float]

    @classmethod
    def fit(cls, frames: list[np.ndarray]) -> "Normalizer":
        stacked = np.concatenate([f[:, : len(OUTPUTS)] for f in frames])  # (N, 3, H, W)
        lo, hi = stacked.min(axis=(0, 2, 3)), stacked.max(axis=(0, 2, 3))
        return cls(center=((hi + lo) / 2).tolist(), scale=(np.maximum((hi - lo) / 2, 1e-6) * 1.1).tolist())

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


def load_frames(dataset_dir: Path, sim_id: str) -> np.ndarray:
    """All frames of one simulation as (T, 4, H, W) float32: u, v, p, mask."""
    ds = open_simulation(dataset_dir, sim_id)
    return np.stack([ds[name].values for name in INPUTS], axis=1).astype(np.float32)


class PairSource:
    """In-memory pairs of the given simulations, served as normalised batches."""

    def __init__(self, dataset_dir: Path, sim_ids: list[str], stride: int):
        self.frames = [load_frames(dataset_dir, s) for s in sim_ids]
        self.pairs = [(i, t) for i, f in enumerate(self.frames) for t in range(len(f) - stride)]
        if not self.pairs:
            raise UserError(f"no (t, t+{stride}) pairs: the simulations have too few frames for frame stride {stride}")
        self.stride = stride
        self.height, self.width = self.frames[0].shape[-2:]

    def __len__(self) -> int:
        return len(self.pairs)

    def batch(self, indices: np.ndarray, norm: Normalizer) -> tuple[np.ndarray, np.ndarray]:
        """cond (B, 4, H, W) and target (B, 3, H, W) in network units."""
        cond = np.stack([self.frames[self.pairs[j][0]][self.pairs[j][1]] for j in indices])
        target = np.stack([self.frames[self.pairs[j][0]][self.pairs[j][1] + self.stride, :3] for j in indices])
        return norm.encode(cond), norm.encode(target)

