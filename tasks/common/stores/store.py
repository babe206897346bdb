"""The dataset store: one zarr v3 group per simulation, a manifest of completed ones, a digest.

Layout under ``<data root>/datasets/<name>/``::

    store.zarr/<sim_id>/...   xarray Dataset (time, y, x) of u, v, p, vorticity, mask
    manifest.json             sweep spec, completed simulations with their digests

Each frame of a variable is its own chunk, with a crc32c of its compressed bytes; the chunks of a
variable sit together in a few shard files (zarr v3 sharding: the frames, then an index of where
each chunk lies, itself with a crc32c), so a simulation is about twenty files, and one frame is
read as two small byte ranges of its shard (index, chunk). Stores written before sharding (one
file per chunk) read the same: zarr's metadata says which layout an array has.

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
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.common.config.errors import UserError

if TYPE_CHECKING:  # zarr and xarray (with pandas, about 1 s of CPU) are imported where data is read or written: a flow
    import xarray as xr  # process that only plans, logs and reads manifests never loads them
    import zarr
    from zarr.abc.store import Store

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


def content_digest(ds: "xr.Dataset") -> str:
    """SHA-256 of the variables' bytes (fixed order) and the attributes."""
    h = hashlib.sha256()
    for name in VARIABLES:
        h.update(name.encode())
        h.update(np.ascontiguousarray(ds[name].values).tobytes())
    h.update(json.dumps(ds.attrs, sort_keys=True, default=str).encode())
    return h.hexdigest()


SHARD_BYTES = 64 << 20  # a shard file holds at most this many uncompressed bytes of one variable


def frames_per_shard(frames: int, frame_bytes: int) -> int:
    """Frames in one shard file of a variable: all ``frames`` of it, as long as they stay under SHARD_BYTES
    uncompressed (the demo's 64 frames of 128 x 64 float32 are 2 MiB: one shard per variable)."""
    return max(1, min(frames, SHARD_BYTES // max(frame_bytes, 1)))


def write_simulation(dataset_dir: Path, sim_id: str, ds: "xr.Dataset") -> None:
    """Write one simulation's group, replacing any partial group left by an interrupted run.

    The whole simulation is in memory and every shard is written in one piece (never read, modified
    and written again). A writer killed in the middle leaves a group that the manifest does not
    name: the next sweep removes it and simulates it again."""
    import zarr

    store = dataset_dir / STORE
    group_dir = store / sim_id
    if group_dir.exists():
        shutil.rmtree(group_dir)
    compressor = zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")
    frames, ny, nx = ds.sizes["time"], ds.sizes["y"], ds.sizes["x"]
    encoding = {}
    for name in VARIABLES:
        per_shard = frames_per_shard(frames, ny * nx * ds[name].dtype.itemsize)
        # crc32c over each compressed frame: a damaged chunk fails to read instead of decoding to wrong values
        encoding[name] = {"chunks": (1, ny, nx), "shards": (per_shard, ny, nx), "compressors": [compressor, zarr.codecs.Crc32cCodec()]}
    ds.to_zarr(store, group=sim_id, mode="w", zarr_format=3, consolidated=False, encoding=encoding)


def frame_file(array: "zarr.Array", frame: int) -> str:
    """The store key (under ``store.zarr/``) of the file that holds ``frame`` of a (time, y, x) array:
    its shard, or, in a store written before sharding, the frame's own chunk."""
    per_file = array.shards[0] if array.shards else array.chunks[0]
    return f"{array.path}/{array.metadata.encode_chunk_key((frame // per_file,) + (0,) * (array.ndim - 1))}"


def damaged(dataset_dir: Path, sim_id: str, name: str, frame, why: str) -> UserError:
    """The one-line error for damaged data, naming where it is and how to repair it."""
    where = f"frame {frame}" if frame is not None else "a frame"
    return UserError(f"dataset {dataset_dir.name!r}, simulation {sim_id}, variable {name}, {where} {why}; repair it with "
                     f"python -m flows generate --dataset {dataset_dir.name} --verify (the sweep's other options as it was made), "
                     "which simulates the damaged simulations again")


def checked(values: np.ndarray, dataset_dir: Path, sim_id: str, name: str, frames, array: "zarr.Array | None" = None) -> np.ndarray:
    """``values`` (F, ...) of ``frames`` unchanged; the ``damaged`` error at the first frame holding a
    non-finite value (a lost chunk or shard file reads as NaN), naming its file when ``array`` is given."""
    bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if bad.any():
        frame = int(np.asarray(frames)[int(np.argmax(bad))])
        where = f" (file {STORE}/{frame_file(array, frame)})" if array is not None else ""
        raise damaged(dataset_dir, sim_id, name, frame, f"is missing or not finite{where}")
    return values


# What reading a damaged chunk raises: it fails its checksum (ValueError), does not decompress
# (RuntimeError from Blosc), or its file cannot be read (OSError). A shard whose index fails its
# checksum or is cut short raises the same for every frame it holds.
CHUNK_ERRORS = (ValueError, RuntimeError, OSError)


def _read_error(array: "zarr.Array", frame: int) -> Exception | None:
    """What reading ``frame`` alone raises (one of CHUNK_ERRORS), or None if it reads."""
    try:
        array.oindex[[frame]]
    except CHUNK_ERRORS as exc:
        return exc
    return None


def unreadable(array: "zarr.Array", frame: int, exc: Exception, dataset_dir: Path, sim_id: str, name: str) -> UserError:
    """The ``damaged`` error for ``frame``, which does not read: it names the file, and for a sharded
    array whether only the frame's chunk is damaged or the whole shard (its index, or a cut-short file)."""
    file = f"{STORE}/{frame_file(array, frame)}"
    why = f"({type(exc).__name__}: damaged chunk in file {file})"
    if array.shards:
        per_shard = array.shards[0]
        first = frame - frame % per_shard
        others = [f for f in range(first, min(first + per_shard, array.shape[0])) if f != frame]
        if others and all(_read_error(array, f) for f in others):
            why = f"({type(exc).__name__}: shard file {file}, frames {first}-{first + len(others)}, is damaged as a whole: its index fails its checksum or the file is cut short)"
    return damaged(dataset_dir, sim_id, name, frame, f"cannot be read {why}")


def _frame_values(array: "zarr.Array", frames: np.ndarray) -> np.ndarray:
    """Frames (F, ...) of ``array`` in the order asked. A sharded array is read shard by shard: a shard
    that holds at least a quarter of its frames' worth of the frames asked for is read whole (one read
    of its file, several times faster in zarr than a list of its chunks), otherwise frame by frame."""
    if not array.shards:
        return array.oindex[frames]
    per_shard = array.shards[0]
    values = np.empty((len(frames), *array.shape[1:]), dtype=array.dtype)  # (F, ...)
    shard = frames // per_shard
    for s in np.unique(shard):
        at = np.flatnonzero(shard == s)
        lo, hi = int(s) * per_shard, min((int(s) + 1) * per_shard, array.shape[0])
        own = frames[at]
        values[at] = array[lo:hi][own - lo] if 4 * len(np.unique(own)) >= hi - lo else array.oindex[own]
    return values


def read_frames(array: "zarr.Array", frames, dataset_dir: Path, sim_id: str, name: str) -> np.ndarray:
    """Frames (F, ...) of a stored array, checked: a chunk that fails to decode or its checksum, or a
    frame that is not finite, is the ``damaged`` error naming that frame and its file."""
    frames = np.arange(array.shape[0])[frames] if isinstance(frames, slice) else np.asarray(frames)
    try:
        values = _frame_values(array, frames)
    except CHUNK_ERRORS:
        # Frame by frame: to name the one that does not read, or, when the damaged chunk was one that a
        # whole-shard read decoded without being asked for, to read the frames asked for around it.
        parts = []
        for frame in frames:
            try:
                parts.append(array.oindex[[int(frame)]])
            except CHUNK_ERRORS as exc:
                raise unreadable(array, int(frame), exc, dataset_dir, sim_id, name) from None
        values = np.concatenate(parts) if parts else array.oindex[frames]
    return checked(values, dataset_dir, sim_id, name, frames, array)


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
    import zarr

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


def open_simulation(dataset_dir: Path, sim_id: str) -> "xr.Dataset":
    import xarray as xr

    return xr.open_zarr(dataset_dir / STORE, group=sim_id, zarr_format=3, consolidated=False)


def frame_store(dataset_dir: Path) -> "Store":
    """Read-only zarr store of a dataset's simulations (the root that ``open_frame_arrays`` reads)."""
    import zarr

    return zarr.storage.LocalStore(dataset_dir / STORE, read_only=True)


def open_frame_arrays(store: "Store", sim_id: str, names: tuple[str, ...]) -> "dict[str, zarr.Array]":
    """Handles on one simulation's (time, y, x) arrays, one chunk per frame (sharded or not); reads metadata only."""
    import zarr

    try:
        group = zarr.open_group(store, path=sim_id, mode="r", zarr_format=3, use_consolidated=False)
        return {name: group[name] for name in names}
    except (FileNotFoundError, KeyError) as exc:
        raise UserError(f"simulation {sim_id!r} is missing from the zarr store {store} ({type(exc).__name__}); "
                        "rerun 'python -m flows generate' for this dataset") from None


@contextlib.contextmanager
def writer_lock(folder: Path, what: str, wait_s: float = 0.0):
    """Hold the one-writer lock of ``folder`` (a dataset or a run) for the block: an exclusive flock on
    a file beside it, released when the block ends or the process dies. UserError naming the holder's
    pid and host if another process holds it (for longer than ``wait_s`` seconds)."""
    lock_path = folder.parent / f".{folder.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    with open(lock_path, "a+") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
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
