"""A small test workload, framework-neutral: two-class points from a stated synthetic model in a zarr store, a split by index, accuracy as its quality target.

It exists to show (and test) that a workload joins the benchmark with its own folder and one table
entry: here the entry is ``KARMAN_WORKLOADS=toy=tests.workloads.toy``, set by its test.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from tasks.common.config.errors import UserError
from tasks.common.config.settings import Settings
from tasks.common.specs import GenerateSpec, TrainSpec
from tasks.workloads import Workload

MANIFEST = "manifest.json"
TARGET_ACCURACY = 0.9


def flops_per_sample(hidden: int) -> int:
    """The MLP 2-H-2's training FLOPs per sample: forward 2·(2·H + H·2), backward twice that less the first layer's
    input gradient (2·2·H)."""
    return 3 * 2 * (2 * hidden + hidden * 2) - 2 * 2 * hidden


def generate(folder: Path, samples: int = 240, seed: int = 0) -> None:
    """Two Gaussian blobs in the plane (centres (-1, -1) and (1, 1), std 0.6; about 5 % of points fall on
    the wrong side), as arrays x (N, 2) float32 and y (N,) int64 in ``folder``/data.zarr."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, samples)
    x = (rng.normal(0.0, 0.6, (samples, 2)) + np.where(y[:, None] == 1, 1.0, -1.0)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    root = zarr.open_group(folder / "data.zarr", mode="w", zarr_format=3)
    root.create_array("x", data=x)
    root.create_array("y", data=y.astype(np.int64))
    digest = hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps({"digest": digest, "samples": samples, "synthetic": True}))


@dataclass
class ToyData:
    x: dict[str, np.ndarray]  # role -> (n, 2)
    y: dict[str, np.ndarray]  # role -> (n,)
    split: dict[str, list[str]]
    dataset_digest: str
    in_memory: bool = True


def _manifest(settings, dataset: str) -> dict:
    path = settings.dataset_dir(dataset) / MANIFEST
    if not path.is_file():
        raise UserError(f"toy dataset {dataset!r} not found under {path.parent.parent}")
    return json.loads(path.read_text())


def prepare(settings: Settings, spec: TrainSpec, main: bool = True) -> ToyData:
    """Samples split by index (shuffled by the seed): 60 % train, 20 % validation, 20 % test."""
    manifest = _manifest(settings, spec.dataset)
    root = zarr.open_group(settings.dataset_dir(spec.dataset) / "data.zarr", mode="r")
    x, y = np.asarray(root["x"]), np.asarray(root["y"])
    order = np.random.default_rng(spec.seed).permutation(len(y))
    cut = {"train": order[: len(y) * 3 // 5], "val": order[len(y) * 3 // 5: len(y) * 4 // 5], "test": order[len(y) * 4 // 5:]}
    return ToyData({k: x[v] for k, v in cut.items()}, {k: y[v] for k, v in cut.items()},
                   {k: [str(i) for i in v] for k, v in cut.items()}, manifest["digest"])


def check(settings: Settings, spec: TrainSpec, batch_sizes: list[int], world: int, memory: int | None = None) -> None:
    train = _manifest(settings, spec.dataset)["samples"] * 3 // 5
    for b in batch_sizes:
        if b % world or b > train:
            raise UserError(f"batch size {b} must split over {world} devices and be at most the {train} training samples")


def dataset_info(settings: Settings, dataset: str) -> tuple[str, dict]:
    manifest = _manifest(settings, dataset)
    return manifest["digest"], {"samples": manifest["samples"]}


def write(settings: Settings, spec: GenerateSpec, parent_run_id: str | None = None) -> dict:
    """Its dataset in the store (written once, 240 points), recorded as an MLflow generate run: a benchmark makes it so."""
    import time

    from tasks.common.stores.datasets import record_generate

    folder, start = settings.dataset_dir(spec.dataset), time.perf_counter()
    written = not (folder / MANIFEST).is_file()
    if written:
        generate(folder)
    manifest = _manifest(settings, spec.dataset)
    return record_generate(settings, spec, manifest, written, time.perf_counter() - start, ("samples", manifest["samples"]),
                           {"workload": "toy", "dataset": spec.dataset}, "Two Gaussian blobs (synthetic)", parent_run_id)


def setting(spec: TrainSpec) -> str:
    return f"MLP 2-{spec.options.hidden}-2"


WORKLOAD = Workload(
    name="toy", title="Two-class MLP (test workload)", data="synthetic: two Gaussian blobs in the plane",
    frameworks=("torch", "tensorflow"), main_loss="loss_ce", target=f"validation accuracy at least {TARGET_ACCURACY}",
    prepare=prepare, check=check, dataset_info=dataset_info, setting=setting, dataset="blobs", generate=write)
