"""The one device helper: a device kind resolved to a torch device, autocast context, sync and data-parallel layout.

For data-parallel runs it says how the model and the batch are spread over the devices.

Data parallelism per kind: ``cpu`` and ``cuda`` run one process per device, each with torchrun's environment
(DistributedDataParallel over gloo or NCCL; the helper joins the process group that environment describes in
RANK/WORLD_SIZE); ``xla`` runs one process that drives every core through SPMD (a 1-D device mesh,
the batch sharded along it). torch_xla is imported only when the ``xla`` kind is asked for; the
process must have its device environment (PJRT_DEVICE, ...) set before that import.
"""

import contextlib
import os
from dataclasses import dataclass
from typing import Callable, ContextManager, Literal

import torch

from models.host import DEVICE_KINDS, DeviceKind, DeviceUnavailable  # noqa: F401  (DeviceUnavailable: raised here, caught by the job entry)

Precision = Literal["fp32", "bf16"]


def _nothing() -> None:
    return None


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


@dataclass
class DeviceContext:
    kind: str
    device: torch.device
    autocast: Callable[[], ContextManager]
    sync: Callable[[], None]  # wait until queued work is done (for timing)
    world_size: int  # devices taking part (processes for ddp, cores for spmd)
    description: str
    rank: int = 0
    strategy: str = "single"  # single | ddp | spmd
    wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None  # DDP wrapper for ddp
    step_end: Callable[[], None] = _nothing  # xla: cut and run the step's graph
    shard: Callable[[torch.Tensor], torch.Tensor] = _same  # spmd: split a (B, ...) batch over the mesh

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mean_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """Average of ``values`` over the ddp ranks (itself otherwise)."""
        if self.strategy != "ddp":
            return values
        import torch.distributed as dist

        values = values.clone()
        dist.all_reduce(values)
        return values / self.world_size

    def close(self) -> None:
        """Leave the process group. Its C++ object is kept until the process ends (``_ENDED_GROUPS``): dropped here, it
        would be destroyed when the last DDP module's reducer is freed, with the GIL held, and gloo's destructor joins its
        worker thread, which may still be finishing the last allreduce and waiting for the GIL to free that work's
        tensors. A rank hung there for 10 minutes on a loaded 2-core host (gdb: the main thread in
        ``~ProcessGroupGloo`` joining, the worker in ``~AsyncAllreduceWork`` waiting for the GIL)."""
        if self.strategy == "ddp":
            import torch.distributed as dist

            if dist.is_initialized():
                _ENDED_GROUPS.append(dist.group.WORLD)
                dist.destroy_process_group()


_ENDED_GROUPS: list = []  # process groups left by close(), alive until the process ends (see DeviceContext.close)


def _autocast(device: torch.device, precision: str) -> Callable[[], ContextManager]:
    if precision != "bf16":
        return contextlib.nullcontext
    kind = device.type if device.type in ("cpu", "cuda") else "xla"
    return lambda: torch.autocast(kind, dtype=torch.bfloat16)


# glibc mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def keep_freed_memory() -> bool:
    """Make this process's C heap keep freed memory for reuse; True if the allocator took it.

    By default glibc serves each block over 32 MiB with a fresh mmap and unmaps it on free, and
    trims the heap's free top: a training step's large activations and temporaries are then
    zero-filled page by page by the kernel on every step (on a 2-core VM, 12 s of system time in a
    70 s training benchmark and about 8% of the step). With mmap off and trimming raised to 2 GiB,
    freed blocks are reused. Memory is not handed back to the kernel until the process ends, so
    call this only in processes that run one training or inference job. A no-op (False) on C
    libraries other than glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version  # present in glibc only
    except (OSError, AttributeError):
        return False
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def torchrun_world() -> tuple[int, int, int]:
    """(rank, local rank, world size) from torchrun's environment; (0, 0, 1) outside torchrun."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def resolve_device(kind: str, precision: str = "fp32", data_parallel: bool = False) -> DeviceContext:
    """Device, autocast factory and synchronisation for ``kind``; DeviceUnavailable if it is missing.

    With ``data_parallel``: under torchrun (WORLD_SIZE > 1) a cpu/cuda process joins the process group
    and gets a DDP wrapper; an xla process with several devices switches to SPMD over all of them."""
    if kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device {kind!r}; choose one of {', '.join(DEVICE_KINDS)}")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"unknown precision {precision!r}; choose fp32 or bf16")
    if kind == "xla":
        return _resolve_xla(precision, data_parallel)
    rank, local_rank, world = torchrun_world() if data_parallel else (0, 0, 1)
    if kind == "cpu":
        device, sync = torch.device("cpu"), _nothing
        desc = f"cpu ({torch.get_num_threads()} threads)"
    else:
        if not torch.cuda.is_available():
            raise DeviceUnavailable("device cuda requested but no CUDA GPU is visible (torch.cuda.is_available() is False)")
        if local_rank >= torch.cuda.device_count():
            raise DeviceUnavailable(f"rank {rank} needs GPU {local_rank} but only {torch.cuda.device_count()} are visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # a training or inference process runs one job of fixed shapes: cuDNN times its algorithms once per shape
        # and keeps the fastest (its heuristic's pick for the 3-D GAN's odd kernels and channel counts can be far slower)
        torch.backends.cudnn.benchmark = True
        sync, desc = torch.cuda.synchronize, torch.cuda.get_device_name(local_rank)
    ctx = DeviceContext(kind, device, _autocast(device, precision), sync, world if world > 1 else _count(kind), desc, rank=rank)
    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        if not dist.is_initialized():
            dist.init_process_group("nccl" if kind == "cuda" else "gloo", device_id=device if kind == "cuda" else None)
        ctx.strategy, ctx.world_size = "ddp", world
        ctx.description = f"{desc} x{world} (DDP over {dist.get_backend()})"
        ids = [local_rank] if kind == "cuda" else None
        # No buffer broadcast: a GAN calls D several times per step, and broadcasting the batch-norm
        # running statistics in place at each call breaks the graph of the previous call. Each rank
        # keeps its own running statistics (rank 0's are saved); normalisation in training uses the
        # batch's own statistics anyway.
        ctx.wrap = lambda module: DistributedDataParallel(module, device_ids=ids, broadcast_buffers=False)
    elif data_parallel:
        ctx.world_size = 1
    return ctx


def _count(kind: str) -> int:
    return torch.cuda.device_count() if kind == "cuda" else 1


def _resolve_xla(precision: str, data_parallel: bool) -> DeviceContext:
    pjrt = os.environ.get("PJRT_DEVICE")
    if not pjrt:
        raise DeviceUnavailable("device xla requested but PJRT_DEVICE is not set (TPU on a TPU host, CPU for testing)")
    try:
        import torch_xla
        import torch_xla.runtime as xr

        world = xr.global_runtime_device_count()
        if data_parallel and world > 1:
            xr.use_spmd()
        device = torch_xla.device()
    except Exception as exc:  # the runtime raises many kinds when no TPU is attached
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DeviceUnavailable(f"device xla requested but the {pjrt} runtime did not start: {first}") from exc
    import torch_xla.core.xla_model as xm

    def sync() -> None:
        torch_xla.sync()
        xm.wait_device_ops()

    ctx = DeviceContext("xla", device, _autocast(device, precision), sync, world, f"xla:{pjrt} x{world}", step_end=torch_xla.sync)
    if data_parallel and world > 1:
        import numpy as np
        import torch_xla.distributed.spmd as xs

        mesh = xs.Mesh(np.arange(world), (world,), ("data",))

        def shard(t: torch.Tensor) -> torch.Tensor:
            xs.mark_sharding(t, mesh, ("data",) + (None,) * (t.dim() - 1))
            return t

        ctx.strategy, ctx.shard = "spmd", shard
        ctx.description = f"xla:{pjrt} x{world} (SPMD, batch sharded over {world} devices)"
    return ctx


def to_cpu(obj):
    """The same nested structure with every tensor detached and on the CPU (XLA and CUDA state)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj
