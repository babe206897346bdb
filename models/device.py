"""The one device helper: resolves a device kind to a torch device, an autocast context and a sync.

torch_xla is imported only when the ``xla`` kind is asked for; the caller's process must have its
device environment (PJRT_DEVICE, ...) set before that import.
"""

import contextlib
import os
from dataclasses import dataclass
from typing import Callable, ContextManager, Literal

import torch

DeviceKind = Literal["cpu", "cuda", "xla"]
DEVICE_KINDS: tuple[str, ...] = ("cpu", "cuda", "xla")
Precision = Literal["fp32", "bf16"]


class DeviceUnavailable(RuntimeError):
    """The requested device kind cannot be used on this host."""


@dataclass
class DeviceContext:
    kind: str
    device: torch.device
    autocast: Callable[[], ContextManager]
    sync: Callable[[], None]
    world_size: int
    description: str


def resolve_device(kind: str, precision: str = "fp32") -> DeviceContext:
    """Device, autocast factory and synchronisation for ``kind``; DeviceUnavailable if it is missing."""
    if kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device {kind!r}; choose one of {', '.join(DEVICE_KINDS)}")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"unknown precision {precision!r}; choose fp32 or bf16")
    if kind == "cpu":
        device, sync, world, desc = torch.device("cpu"), (lambda: None), 1, f"cpu ({torch.get_num_threads()} threads)"
    elif kind == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable("device cuda requested but no CUDA GPU is visible (torch.cuda.is_available() is False)")
        device, sync = torch.device("cuda"), torch.cuda.synchronize
        world, desc = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    else:
        pjrt = os.environ.get("PJRT_DEVICE")
        if not pjrt:
            raise DeviceUnavailable("device xla requested but PJRT_DEVICE is not set (TPU on a TPU host, CPU for testing)")
        try:
            import torch_xla
            import torch_xla.runtime as xr

            device = torch_xla.device()
            world = xr.global_runtime_device_count()
        except Exception as exc:  # the runtime raises many kinds when no TPU is attached
            raise DeviceUnavailable(f"device xla requested but the {pjrt} runtime did not start: {exc}") from exc
        sync, desc = torch_xla.sync, f"xla:{pjrt} x{world}"
    dtype_ctx = device.type if device.type in ("cpu", "cuda") else "xla"
    if precision == "bf16":
        autocast = lambda: torch.autocast(dtype_ctx, dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext
    return DeviceContext(kind, device, autocast, sync, world, desc)
