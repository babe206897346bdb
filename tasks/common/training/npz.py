"""Checkpoints as one npz of arrays with the history as JSON, for the runtimes whose state is numpy arrays (tensorflow, jax)."""

import json
import os
from pathlib import Path

import numpy as np

from tasks.common.errors import UserError


def save_npz(state: dict, path: Path) -> None:
    """The model's arrays (keys may hold '/') and the history as JSON in one npz, written atomically."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
    arrays = {k.replace("/", "__"): v for k, v in state["model"].items()}
    np.savez(tmp, history=np.array(json.dumps(state["history"])), **arrays)
    os.replace(tmp, path)


def load_npz(path: Path) -> dict:
    """What save_npz wrote; UserError naming the file if it does not load."""
    try:
        with np.load(path) as data:
            history = json.loads(str(data["history"]))
            model = {k.replace("__", "/"): data[k] for k in data.files if k != "history"}
    except Exception as exc:  # numpy and zipfile raise many kinds for a damaged file
        raise UserError(f"checkpoint {path} is corrupt or truncated ({type(exc).__name__}); start the run afresh") from None
    return {"model": model, "history": history}
