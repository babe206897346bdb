"""What this host offers the computation (CPU cores, devices that can be opened), framework-free."""

import os
from typing import Literal, get_args

# The device kinds a run can ask for: cpu, cuda (NVIDIA GPUs) and xla (TPU cores), named once.
DeviceKind = Literal["cpu", "cuda", "xla"]
DEVICE_KINDS: tuple[str, ...] = get_args(DeviceKind)


class DeviceUnavailable(RuntimeError):
    """The requested device kind cannot be used on this host."""


def cpu_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def host_peak_memory_mb() -> float:
    """This process's peak resident memory in MiB (getrusage reports KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
