"""What the runtimes whose state is numpy arrays share (tensorflow, jax): checkpoints as one npz of arrays with the history as JSON, and an epoch seed the trainers draw from."""

import json
import os
from pathlib import Path

import numpy as np

from tasks.common.errors import UserError
from tasks.common.training.frameworks import DeviceRuntime


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


class NpzRuntime(DeviceRuntime):
    """A runtime whose trainers hand the loop numpy arrays as state and draw randomness from ``epoch_seed``."""

    epoch_seed = 0

    def seed_epoch(self, seed: int, epoch: int) -> None:
        """This epoch's seed on this worker, whatever ran before (the trainers draw statelessly from it)."""
        from tasks.common.data import epoch_seed

        self.epoch_seed = epoch_seed(seed, epoch, self.ctx.rank) % 2**31

    def save(self, state: dict, path: Path) -> None:
        """Weights and optimiser state as one npz of arrays with the history as JSON, written atomically."""
        save_npz(state, path)

    def load(self, path: Path) -> dict:
        return load_npz(path)
