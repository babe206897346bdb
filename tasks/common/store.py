"""The dataset store: one zarr v3 group per simulation, a manifest of completed ones, a digest.

Layout under ``<data root>/datasets/<name>/``::

    store.zarr/<sim_id>/...   xarray Dataset (time, y, x) of u, v, p, vorticity, mask
    manifest.json             sweep spec, completed simulations with their digests

A simulation counts only once the manifest names it; the manifest is replaced atomically, so an
interrupted sweep never leaves a half-written simulation marked complete.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
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


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read a megabyte at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


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
    # crc32c over each compressed chunk: a damaged chunk fails to read instead of decoding to wrong values
    encoding = {name: {"chunks": (1, ny, nx), "compressors": [compressor, zarr.codecs.Crc32cCodec()]} for name in VARIABLES}
    ds.to_zarr(store, group=sim_id, mode="w", zarr_format=3, consolidated=False, encoding=encoding)


def damaged(dataset_dir: Path, sim_id: str, name: str, frame, why: str) -> UserError:
    """The one-line error for damaged data, naming where it is and how to repair it."""
    where = f"frame {frame}" if frame is not None else "a frame"
    return UserError(f"dataset {dataset_dir.name!r}, simulation {sim_id}, variable {name}, {where} {why}; repair it with "
                     f"python -m flows generate --dataset {dataset_dir.name} --verify (the sweep's other options as it was made), "
                     "which simulates the damaged simulations again")


def checked(values: np.ndarray, dataset_dir: Path, sim_id: str, name: str, frames) -> np.ndarray:
    """``values`` (F, ...) of ``frames`` unchanged; the ``damaged`` error at the first frame holding a
    non-finite value (a lost chunk reads as NaN)."""
    bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if bad.any():
        raise damaged(dataset_dir, sim_id, name, int(np.asarray(frames)[int(np.argmax(bad))]), "is missing or not finite")
    return values


# What reading a damaged chunk raises: it fails its checksum (ValueError), does not decompress
# (RuntimeError from Blosc), or its file cannot be read (OSError).
CHUNK_ERRORS = (ValueError, RuntimeError, OSError)


def read_frames(array: zarr.Array, frames, dataset_dir: Path, sim_id: str, name: str) -> np.ndarray:
    """Frames (F, ...) of a stored array, checked: a chunk that fails to decode or its checksum, or a
    frame that is not finite, is the ``damaged`` error naming that frame."""
    frames = np.arange(array.shape[0])[frames] if isinstance(frames, slice) else np.asarray(frames)
    try:
        values = array.oindex[frames]
    except CHUNK_ERRORS as exc:
        for frame in frames:  # which one
            try:
                array.oindex[[int(frame)]]
            except CHUNK_ERRORS:
                raise damaged(dataset_dir, sim_id, name, int(frame), f"cannot be read ({type(exc).__name__}: damaged chunk)") from None
        raise
    return checked(values, dataset_dir, sim_id, name, frames)


def verify_simulation(dataset_dir: Path, sim_id: str, digest: str) -> str | None:
    """What is wrong with a stored simulation (a chunk that does not read or fails its checksum, a
    non-finite frame, content that differs from its digest), or None if it is whole."""
    try:
        arrays = open_frame_arrays(frame_store(dataset_dir), sim_id, VARIABLES)
        for name in VARIABLES:
            read_frames(arrays[name], slice(None), dataset_dir, sim_id, name)
        found = content_digest(open_simulation(dataset_dir, sim_id))
    except UserError as exc:
        return str(exc).split("; repair", 1)[0]
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if found == digest else "its content differs from the digest recorded when it was written"


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

    def remove(self, sim_id: str) -> None:
        """Forget a simulation (damaged data), so that the next sweep simulates it again."""
        self.simulations.pop(sim_id, None)
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


def workload_manifest(dataset_dir: Path, workload: str) -> dict[str, Any]:
    """The manifest of ``workload``'s dataset in ``dataset_dir``; UserError if it is missing or another workload's."""
    path = dataset_dir / MANIFEST
    if not path.is_file():
        raise UserError(f"dataset {dataset_dir.name!r} not found under {dataset_dir.parent} "
                        f"(run 'python -m flows generate --workload {workload} --dataset {dataset_dir.name}' first)")
    manifest = json.loads(path.read_text())
    if manifest.get("workload") != workload:
        raise UserError(f"dataset {dataset_dir.name!r} is not a {workload} dataset (it holds {manifest.get('workload', 'karman')} data); "
                        f"name a {workload} dataset (python -m flows generate --workload {workload})")
    return manifest


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


@contextlib.contextmanager
def writer_lock(folder: Path, what: str):
    """Hold the one-writer lock of ``folder`` (a dataset or a run) for the block: an exclusive flock on
    a file beside it, released when the block ends or the process dies. UserError naming the holder's
    pid and host if another process holds it."""
    lock_path = folder.parent / f".{folder.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise UserError(f"{what} is being written by {holder}; wait until it ends or stop it") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on host {socket.gethostname()}")
        lock.flush()
        try:
            yield
        finally:
            lock.seek(0)
            lock.truncate()
