"""JAX as the training loop's runtime: one process on one device kind (cpu, cuda, or xla = a TPU host's jax) and its devices (data-parallel: the batch sharded over them, the weights replicated), the mean over them, npz checkpoints, memory."""

import os

# Before jax is imported: jax would otherwise take most of a GPU's memory at start.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from dataclasses import dataclass  # noqa: E402

from models.host import DeviceUnavailable, host_peak_memory_mb  # noqa: E402
from tasks.common.config.frameworks import FRAMEWORKS  # noqa: E402
from tasks.common.runtimes.npz import NpzRuntime  # noqa: E402

PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "xla": "tpu"}  # the run's device kind -> jax's platform


@dataclass
class JaxContext:
    """The devices one jax process trains on: with several, each step's batch is sharded over them along its
    first axis and the weights are replicated, so jit's partitioner averages the gradients across them."""

    kind: str
    devices: list
    description: str
    rank: int = 0
    is_main: bool = True

    @property
    def world_size(self) -> int:
        return len(self.devices)

    @property
    def device(self):
        return self.devices[0]

    def shardings(self):
        """(replicated on every device, split along the first axis over them): jax.sharding.NamedSharding pair."""
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        mesh = Mesh(np.array(self.devices), ("batch",))
        return NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("batch"))


def resolve_jax(device: str, world: int = 1) -> JaxContext:
    """The first ``world`` jax devices of the device kind; DeviceUnavailable if jax sees fewer."""
    import jax

    platform = PLATFORMS[device]
    try:
        found = jax.devices(platform)
    except Exception as exc:  # a missing backend raises RuntimeError, or an AssertionError when its plugin is absent
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else f"{type(exc).__name__}; is jax's {platform} plugin installed?"
        raise DeviceUnavailable(f"device {device} requested but jax {jax.__version__} has no {platform} backend here ({why})") from None
    if len(found) < world:
        raise DeviceUnavailable(f"jax finds {len(found)} {device} device(s) here; the run needs {world}")
    picked = found[:world]
    return JaxContext(device, picked, f"{picked[0].device_kind} (jax {PLATFORMS[device]})" + (f" x{world}" if world > 1 else ""))


class JaxRuntime(NpzRuntime):
    """jax on its devices in one process: the mean over them is the collective that agrees."""

    framework = "jax"
    checkpoint = FRAMEWORKS["jax"].checkpoint

    def __init__(self, device: str, world: int = 1, threads: int | None = None):
        single = device == "cpu" and threads == 1
        if single:  # before jax starts: XLA's CPU runtime on one thread (other counts are XLA's own choice, not set here)
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1".strip()
        import jax

        if device == "cpu" and world > 1:  # before jax's CPU backend starts: that many host devices, sharing the cores
            jax.config.update("jax_num_cpu_devices", world)
        self.version = jax.__version__
        self.ctx = resolve_jax(device, world)
        # XLA's CPU client sizes its own thread pool: one thread per core the process may use (the count
        # torch and tensorflow are given by default too), or one where asked.
        self.threads = (1 if single else len(os.sched_getaffinity(0))) if device == "cpu" else None
        # values each device contributes (devices, n) -> their mean on every device; one device: the values themselves
        self._mean = jax.pmap(lambda v: jax.lax.pmean(v, "devices"), axis_name="devices", devices=self.ctx.devices)

    @property
    def strategy(self) -> str:
        """single (one device) or spmd (the batch sharded over several; jit's partitioner all-reduces the gradients), as torch names them."""
        return "single" if self.ctx.world_size == 1 else "spmd"

    def agree(self, values: list[float]) -> list[float]:
        """The mean over this process's devices of values each contributes (here every device contributes the process's)."""
        import numpy as np

        per_device = np.tile(np.asarray(values, np.float32), (self.ctx.world_size, 1))  # (devices, n)
        return [float(x) for x in np.asarray(self._mean(per_device))[0]]

    def epoch_metrics(self, first: bool) -> dict[str, float]:
        stats = self.ctx.device.memory_stats() if self.ctx.kind != "cpu" else None
        peak = stats.get("peak_bytes_in_use") if stats else None
        return {"peak_memory_mb": peak / 2**20 if peak else host_peak_memory_mb()}

    def close(self) -> None:
        pass


def open_runtime(plan) -> JaxRuntime:
    """The plan's device kind and its world of devices, in this one process."""
    return JaxRuntime(plan.spec.device, plan.world, plan.threads)
