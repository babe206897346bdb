"""The dataset store: one zarr v3 group per simulation, a manifest of completed ones, a digest.

Layout under ``<data root>/datasets/<name>/``::

    store.zarr/<sim_id>/...   xarray Dataset (time, y, x) of u, v, p, vorticity, mask
    manifest.json             sweep spec, completed simulations with their digests

A simulation counts only once the manifest names it; the manifest is replaced atomically, so an
interrupted sweep never leaves a half-written simulation marked complete.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr
from zarr.abc.store import Store

from tasks.common.errors import UserError

VARIABLES = ("u", "v", "p", "vorticity", "mask")
MANIFEST = "manifest.json"
STORE = "store.zarr"


def write_json_atomic(path: Path, payload: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True))
    os.replace(tmp, path)


def content_digest(ds: xr.Dataset) -> str:
    """SHA-256 of the variables' bytes (fixed order) and the attributes."""
    h = hashlib.sha256()
    for name in VARIABLES:
        h.update(name.encode())
        h.update(np.ascontiguousarray(ds[name].values).tobytes())
    h.update(json.dumps(ds.attrs, sort_keys=True, default=str).encode())
    return h.hexdigest()


def write_simulation(dataset_dir: Path, sim_id: str, ds: xr.Dataset) -> None:
    """Write one simulation's group, replacing any partial group left by an interrupted run."""
    store = dataset_dir / STORE
    group_dir = store / sim_id
    if group_dir.exists():
        shutil.rmtree(group_dir)
    compressor = zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")
    ny, nx = ds.sizes["y"], ds.sizes["x"]
    encoding = {name: {"chunks": (1, ny, nx), "compressors": [compressor]} for name in VARIABLES}
    ds.to_zarr(store, group=sim_id, mode="w", zarr_format=3, consolidated=False, encoding=encoding)


class Manifest:
    """Completed simulations of one dataset, and the sweep spec they belong to."""

    def __init__(self, dataset_dir: Path, spec: dict[str, Any]):
        self.dir, self.path, self.spec = dataset_dir, dataset_dir / MANIFEST, spec
        self.simulations: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            data = json.loads(self.path.read_text())
            if data.get("spec") != spec:
                raise UserError(
                    f"dataset {dataset_dir.name!r} already exists with different sweep parameters; "
                    "choose another --dataset name or pass --overwrite"
                )
            self.simulations = data.get("simulations", {})

    def is_complete(self, sim_id: str) -> bool:
        return sim_id in self.simulations and (self.dir / STORE / sim_id).is_dir()

    def add(self, sim_id: str, record: dict[str, Any]) -> None:
        self.simulations[sim_id] = record
        self.save()

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, {"spec": self.spec, "simulations": self.simulations, "digest": self.digest()})

    def digest(self) -> str:
        h = hashlib.sha256()
        for sim_id in sorted(self.simulations):
            h.update(f"{sim_id}:{self.simulations[sim_id]['digest']};".encode())
        return h.hexdigest()[:16]


def consolidate(dataset_dir: Path) -> None:
    zarr.consolidate_metadata(str(dataset_dir / STORE), zarr_format=3)


def remove_stale_groups(dataset_dir: Path, keep: set[str]) -> list[str]:
    """Delete groups that the manifest does not list (partial writes); return their names."""
    store = dataset_dir / STORE
    removed = []
    if store.is_dir():
        for child in store.iterdir():
            if child.is_dir() and child.name not in keep:
                shutil.rmtree(child)
                removed.append(child.name)
    return removed


def load_manifest(dataset_dir: Path) -> dict[str, Any]:
    """The manifest of a finished dataset; UserError if it is missing or empty."""
    path = dataset_dir / MANIFEST
    if not path.exists():
        raise UserError(f"dataset {dataset_dir.name!r} not found under {dataset_dir.parent} (run 'python -m flows generate' first)")
    data = json.loads(path.read_text())
    if not data.get("simulations"):
        raise UserError(f"dataset {dataset_dir.name!r} has no completed simulations")
    return data


def open_simulation(dataset_dir: Path, sim_id: str) -> xr.Dataset:
    return xr.open_zarr(dataset_dir / STORE, group=sim_id, zarr_format=3, consolidated=False)


def frame_store(dataset_dir: Path) -> Store:
    """Read-only zarr store of a dataset's simulations (the root that ``open_frame_arrays`` reads)."""
    return zarr.storage.LocalStore(dataset_dir / STORE, read_only=True)


def open_frame_arrays(store: Store, sim_id: str, names: tuple[str, ...]) -> dict[str, zarr.Array]:
    """Handles on one simulation's (time, y, x) arrays, one chunk per frame; reads metadata only."""
    try:
        group = zarr.open_group(store, path=sim_id, mode="r", zarr_format=3, use_consolidated=False)
        return {name: group[name] for name in names}
    except (FileNotFoundError, KeyError) as exc:
        raise UserError(f"simulation {sim_id!r} is missing from the zarr store {store} ({type(exc).__name__}); "
                        "rerun 'python -m flows generate' for this dataset") from None
