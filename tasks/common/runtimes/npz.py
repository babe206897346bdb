"""What the runtimes whose state is numpy arrays share (tensorflow, jax): checkpoints as one npz of arrays with the history as JSON (tasks.common.runtimes.checkpoint), and an epoch seed the trainers draw from."""

from pathlib import Path

from tasks.common.runtimes.checkpoint import load_npz, save_npz
from tasks.common.config.frameworks import DeviceRuntime


class NpzRuntime(DeviceRuntime):
    """A runtime whose trainers hand the loop numpy arrays as state and draw randomness from ``epoch_seed``."""

    epoch_seed = 0

    def seed_epoch(self, seed: int, epoch: int) -> None:
        """This epoch's seed on this worker, whatever ran before (the trainers draw statelessly from it)."""
        from tasks.common.runtimes.data import epoch_seed

        self.epoch_seed = epoch_seed(seed, epoch, self.ctx.rank) % 2**31

    def save(self, state: dict, path: Path) -> None:
        """Weights and optimiser state as one npz of arrays with the history as JSON, written atomically."""
        save_npz(state, path)

    def load(self, path: Path) -> dict:
        return load_npz(path)
