"""Checkpoint files at their boundary, for every framework: plain on the way in, a loader that admits nothing else, damaged or foreign files named.

What goes in is plain (Python numbers, strings, tensors or arrays), what comes out is read by a loader that admits
nothing else, and a file that does not load is named for what is wrong with it: damaged (truncated, not an archive) or
whole but holding a type no loader here admits. torch's files are read with ``weights_only=True``; the npz files of
TensorFlow and JAX without pickles. Files written before the loop's history was kept plain hold numpy scalars
(validation scores as ``numpy.float64``): exactly those scalar types are admitted on loading, and turned into Python
numbers, so that such runs still resume."""

import json
import os
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.common.config.errors import UserError
from tasks.common.stores.store import file_sha256, write_json_atomic

_PLAIN = (bool, int, float, str, type(None))
# The numpy scalar types an earlier version's histories hold (its records kept numpy's numbers as they came)
_NUMPY_SCALARS = (np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_)


def plain(value, leaves: tuple[type, ...] = (), where: str = "state"):
    """``value`` with every numpy scalar in it turned into the Python number it holds: the object itself where
    nothing needed turning (a module's state dict keeps its type and metadata). TypeError naming ``where`` for
    anything that is neither plain, a dict or list of plain values, nor one of ``leaves`` (tensors, arrays)."""
    if isinstance(value, np.generic):  # before the plain types: numpy.float64 is a float
        number = value.item()
        if isinstance(number, _PLAIN):
            return number
    elif isinstance(value, _PLAIN) or (leaves and isinstance(value, leaves)):
        return value
    elif isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"{where} has a key of type {_type_name(key)}; a checkpoint's keys are strings or integers")
            out[key] = plain(item, leaves, f"{where}.{key}")
        if all(out[k] is value[k] for k in value):
            return value
        rebuilt = type(value)(out)
        if hasattr(value, "_metadata"):  # a module's state dict carries its layers' versions
            rebuilt._metadata = value._metadata
        return rebuilt
    elif isinstance(value, (list, tuple)):
        items = [plain(item, leaves, f"{where}[{i}]") for i, item in enumerate(value)]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    takes = ", ".join(["Python numbers, strings, None, lists, dicts", *(kind.__name__ for kind in leaves)])
    raise TypeError(f"{where} holds a {_type_name(value)}, which this part of a checkpoint does not take ({takes})")


def _type_name(value) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def damaged(path: Path, exc: BaseException) -> UserError:
    """The error for a checkpoint that cannot be read back at all: cut short or not an archive."""
    return UserError(f"checkpoint {path} is damaged ({type(exc).__name__}: it is cut short or not a checkpoint archive) "
                     "and cannot be read back; start the run afresh")


def _foreign(path: Path, what: str) -> UserError:
    """The error for a whole checkpoint holding something the loader does not admit."""
    return UserError(f"checkpoint {path} is whole but holds {what}, which the checkpoint loader does not admit "
                     "(it reads numbers, strings, tensors and arrays only); it was not written by this version: "
                     "resume it with the version that wrote it")


# -- the format's check, before any child starts ------------------------------------------------------------------

_MARKS: dict[str, Callable[[list[str]], bool]] = {
    "torch": lambda names: any(n.endswith("/data.pkl") for n in names),  # torch.save's zip holds the pickle and the tensors
    "npz": lambda names: "history.npy" in names,  # the npz holds the history beside the arrays
}


def check_checkpoint(path: Path, fmt: str) -> None:
    """UserError naming the file if the checkpoint of format ``fmt`` ('torch' or 'npz') is missing or damaged
    (its zip directory is read, not its contents: the job loads those)."""
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}: the run stopped before its first epoch ended; start it afresh")
    try:
        with zipfile.ZipFile(path) as archive:
            if not _MARKS[fmt](archive.namelist()):
                raise zipfile.BadZipFile("not a checkpoint")
    except (zipfile.BadZipFile, OSError) as exc:
        raise damaged(path, exc) from None


# -- torch ----------------------------------------------------------------------------------------------------------

def _numpy_scalar_globals() -> list:
    """What unpickling the numpy scalars of ``_NUMPY_SCALARS`` calls: numpy's scalar constructor, ``numpy.dtype``
    and the dtype classes of those scalars, nothing more."""
    from numpy._core.multiarray import scalar

    return [scalar, np.dtype, *(type(np.dtype(t)) for t in _NUMPY_SCALARS)]


def save_torch(state: dict, path: Path) -> None:
    """``state`` (tensors already on the CPU) as torch's file, written atomically: a crash mid-write leaves the
    previous checkpoint in place. TypeError naming the entry if something in it is not plain."""
    import torch

    state = plain(state, (torch.Tensor,))
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per process: two writers never share one
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_torch(path: Path) -> dict:
    """A torch checkpoint's contents, read by the weights-only loader (numpy's scalars of an earlier version
    admitted and turned into Python numbers); UserError naming the file and what is wrong with it."""
    import torch

    try:
        with torch.serialization.safe_globals(_numpy_scalar_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Unsupported global" not in str(exc) and "Unsupported operand" not in str(exc):
            raise damaged(path, exc) from None
        raise _foreign(path, _unadmitted(path) or "a type") from None
    except Exception as exc:  # torch and zipfile raise many kinds for a damaged file
        raise damaged(path, exc) from None
    return plain(state, (torch.Tensor,), "checkpoint")


def _unadmitted(path: Path) -> str | None:
    """The types a whole torch checkpoint holds that the weights-only loader does not admit, named."""
    import torch

    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - only a better message is at stake
        return None
    admitted = {f"{g.__module__}.{g.__qualname__}" for g in _numpy_scalar_globals()} | set(
        f"{g.__module__}.{g.__qualname__}" for g in torch.serialization.get_safe_globals() if hasattr(g, "__qualname__"))
    foreign = sorted(set(names) - admitted)
    return ", ".join(foreign) if foreign else None


# -- npz (TensorFlow, JAX) ------------------------------------------------------------------------------------------

def save_npz(state: dict, path: Path) -> None:
    """The model's arrays (keys may hold '/') and the history as JSON in one npz, written atomically. TypeError
    naming the entry if the history is not plain or an array holds Python objects."""
    history = json.dumps(plain(state["history"], where="history"))
    arrays = {}
    for key, value in state["model"].items():
        array = np.asarray(value)
        if array.dtype == object:
            raise TypeError(f"model.{key} holds Python objects, which a checkpoint does not take (arrays of numbers only)")
        arrays[key.replace("/", "__")] = array
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, history=np.array(history), **arrays)
    os.replace(tmp, path)


def load_npz(path: Path) -> dict:
    """What save_npz wrote, read without pickles; UserError naming the file and what is wrong with it."""
    try:
        if not zipfile.is_zipfile(path):  # numpy would take any other file for a pickle
            raise zipfile.BadZipFile("not a zip archive")
        with np.load(path, allow_pickle=False) as data:
            history = json.loads(str(data["history"]))
            model = {k.replace("__", "/"): data[k] for k in data.files if k != "history"}
    except ValueError as exc:
        if "allow_pickle" in str(exc):  # an object array: pickled Python objects, which are not loaded
            raise _foreign(path, "pickled Python objects (an array of dtype object)") from None
        raise damaged(path, exc) from None
    except Exception as exc:  # numpy and zipfile raise many kinds for a damaged file
        raise damaged(path, exc) from None
    return {"model": model, "history": history}


# -- the two kept checkpoints and their digests ---------------------------------------------------------------------
# The loop keeps the newest checkpoint at its path and the one before beside it, and the SHA-256 digest of each in a
# JSON file written with them: a file whose digest is not listed there is damaged (a flipped byte, a copy cut short),
# and a resume falls back to the one before. Every step of a save leaves each file that is in place listed, so a
# crash at any point leaves a checkpoint to resume from. A run written before the digests were kept has one file and
# no digests: it resumes from that file, checked as before.

def previous_path(path: Path) -> Path:
    """Where the checkpoint before the newest is kept: ``checkpoint.previous.pt`` beside ``checkpoint.pt``."""
    return path.with_name(f"{path.stem}.previous{path.suffix}")


def digests_path(path: Path) -> Path:
    """The file of the kept checkpoints' digests: ``checkpoint.digests.json`` beside ``checkpoint.pt``."""
    return path.with_name(f"{path.stem}.digests.json")


def _digests(path: Path) -> list[dict] | None:
    """The digests file's entries ({sha256, epoch, step}, newest first), or None where there is none (an earlier version's run)."""
    try:
        return json.loads(digests_path(path).read_text())["checkpoints"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):  # written whole (renamed into place): unreadable means damaged
        return []


def _write_digests(path: Path, entries: list[dict]) -> None:
    write_json_atomic(digests_path(path), {"checkpoints": entries})


def keep_checkpoint(save: Callable[[dict, Path], None], state: dict, path: Path) -> None:
    """``save(state, ...)`` as the newest checkpoint at ``path``, the newest until now kept as the one before (previous_path)
    and the older one dropped, each with its digest; ``state["history"]`` gives its epoch and step."""
    staged = path.with_name(f"{path.stem}.next{path.suffix}")
    save(state, staged)  # written whole or not at all (the runtimes write atomically)
    history = state["history"]
    new = {"sha256": file_sha256(staged), "epoch": int(history["epoch"]), "step": int(history["global_step"])}
    kept = _digests(path)
    if kept is None and path.is_file():  # the first save over an earlier version's single file (the epoch before): its digest as it is
        kept = [{"sha256": file_sha256(path), "epoch": new["epoch"] - 1, "step": 0}]
    kept = kept or []
    _write_digests(path, [new, *kept[:2]])  # every file that may be in place meanwhile is listed
    if path.is_file():
        os.replace(path, previous_path(path))
    os.replace(staged, path)
    _write_digests(path, [new, *kept[:1]])


@dataclass(frozen=True)
class Resumable:
    """The checkpoint a resume reads, and what the newest one written before had reached (its epochs are logged)."""

    path: Path
    logged_epoch: int  # the newest checkpoint's epoch and step: a redone epoch up to them is not logged again
    logged_step: int
    warning: str | None = None  # one line, where the newest is damaged and the one before is read


def resumable(path: Path, fmt: str | None = None) -> Resumable:
    """The newest whole checkpoint of the two kept at ``path``; UserError naming them where neither is whole, or (an
    earlier version's run, no digests) where its one file is missing or damaged. ``fmt`` ('torch' or 'npz'): the
    archive of the one chosen is checked too (before any child starts; a job's loader checks it as it reads)."""
    kept = _digests(path)
    if kept is None:
        if fmt is not None:
            check_checkpoint(path, fmt)
        return Resumable(path, 0, 0)
    listed = {entry["sha256"]: entry for entry in kept if isinstance(entry, dict) and "sha256" in entry}
    newest = max((entry for entry in listed.values()), key=lambda e: e.get("epoch", 0), default={"epoch": 0, "step": 0})
    found = []
    for candidate in (path, previous_path(path)):
        if candidate.is_file() and (entry := listed.get(file_sha256(candidate))):
            if fmt is not None:
                check_checkpoint(candidate, fmt)
            found.append((candidate, entry))
    if not found:
        names = " and ".join(str(p) for p in (path, previous_path(path)) if p.is_file())
        if not names:  # none at all: the run stopped before its first epoch ended
            raise UserError(f"no checkpoint at {path}: the run stopped before its first epoch ended; start it afresh")
        raise UserError(f"checkpoint {names} is damaged (its digest differs from the one written with it) and cannot be "
                        "read back; start the run afresh")
    chosen, entry = max(found, key=lambda f: f[1]["epoch"])
    warning = None
    if entry["epoch"] < newest["epoch"]:
        redone = (f"epoch {newest['epoch']}" if newest["epoch"] == entry["epoch"] + 1
                  else f"epochs {entry['epoch'] + 1}-{newest['epoch']}")
        warning = (f"checkpoint {path} (epoch {newest['epoch']}) is damaged or missing; resuming from the one before, {chosen.name} "
                   f"(epoch {entry['epoch']}): {redone} will be trained again")
    return Resumable(chosen, int(newest["epoch"]), int(newest.get("step", 0)), warning)
