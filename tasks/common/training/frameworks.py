"""The training stage's framework table: each framework's runtime module and checkpoint file and format, named without importing any framework."""

import importlib
from dataclasses import dataclass

from tasks.common.errors import UserError


@dataclass(frozen=True)
class Framework:
    runtime: str  # module with open_runtime(plan) -> the loop's Runtime, imported only in its own child
    checkpoint: str  # the file the runtime writes after every epoch, beside the run's job file
    checkpoint_format: str  # how that file is written: 'torch' (torch.save's zip) or 'npz' (arrays, the history as JSON)


FRAMEWORKS = {
    "torch": Framework("tasks.common.training.runtime_torch", "checkpoint.pt", "torch"),
    "tensorflow": Framework("tasks.common.training.runtime_keras", "checkpoint.npz", "npz"),
    "jax": Framework("tasks.common.training.runtime_jax", "checkpoint.npz", "npz"),
}


def framework(name: str) -> Framework:
    """The framework ``name``; UserError listing the valid names for any other."""
    if name not in FRAMEWORKS:
        raise UserError(f"unknown framework {name!r}; choose one of {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[name]


def open_runtime(plan):
    """The plan's framework on its device, for this rank (imports the framework)."""
    return importlib.import_module(framework(plan.framework).runtime).open_runtime(plan)


class DeviceRuntime:
    """What every framework's runtime reads off its device context ``ctx`` (which rank, of how many, on what)."""

    ctx: object  # models.device.DeviceContext or models.device_keras.KerasContext

    @property
    def is_main(self) -> bool:
        return self.ctx.is_main

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def description(self) -> str:
        return self.ctx.description
