"""The framework table: one entry per framework holds every decision the stages make by framework.

Each entry holds its runtime and probe, checkpoint file and format, how its processes map onto devices and hosts, its
launcher and environment, the strategies and precisions it takes), named without importing any framework.

Nothing outside this table and a framework's own modules compares a framework's name: a stage asks the entry. Adding a
framework is its runtime module, its probe and one entry below.
"""

import importlib
import json
import os
import platform
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass

from tasks.common.config.errors import UserError

DEFAULT = "torch"  # a request's framework when it names none; run names leave it out


def _auto(spec, world: int) -> str:
    return "auto"


def _tensorflow_strategy(spec, world: int) -> str:
    """The spec's strategy, or for auto: multiworker over several hosts, tpu on xla, default for one device, mirrored for more."""
    if spec.strategy != "auto":
        return spec.strategy
    if spec.hosts > 1:
        return "multiworker"
    return "tpu" if spec.device == "xla" else "default" if world == 1 else "mirrored"


def _tensorflow_check(spec) -> None:
    if (spec.strategy == "tpu") != (spec.device == "xla") and spec.strategy != "auto":
        raise ValueError(f"strategy {spec.strategy} does not run on device {spec.device}: tpu is for xla (a TPU host), the others for cpu and cuda")
    if spec.strategy == "mirrored" and spec.device == "cpu" and (spec.world_size or 1) < 2:
        raise ValueError("strategy mirrored on cpu needs --world-size 2 or more (logical CPU devices)")


def _torch_env(device: str, world_size: int | None) -> dict[str, str]:
    if device != "xla":
        return {}
    env = {"PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "TPU")}
    if env["PJRT_DEVICE"] == "CPU" and world_size:  # the XLA CPU runtime (tests): world_size virtual devices
        env["CPU_NUM_DEVICES"] = str(world_size)
    return env


def _tensorflow_env(device: str, world_size: int | None) -> dict[str, str]:
    env = {"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}  # TensorFlow's C++ notices stay out of the run's log
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a cpu run does not open a GPU (nor complain that there is none)
        if platform.machine().lower() in ("x86_64", "amd64"):
            # oneDNN's kernels, which torch's CPU convolutions use too: TensorFlow turns them on by itself only where the CPU
            # has AVX-512 VNNI, BF16 or AMX, and falls back to Eigen's elsewhere (an AVX2 host's calo step 45 -> 31 s of CPU,
            # its first step nearer torch's); a value the user set is kept
            env["TF_ENABLE_ONEDNN_OPTS"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1")
    return env


def _torch_rank_env(env: dict[str, str], rank: int, procs: int, ports: list[int]) -> dict[str, str]:
    """What torchrun --standalone gives rank ``rank`` of ``procs`` on this host that the job reads: its ranks and world, the
    process group's address (torch.distributed's env:// init) and, unless the job's environment ``env`` sets it, one thread each."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(procs), "LOCAL_WORLD_SIZE": str(procs), "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports[0]), "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}


def free_ports(n: int) -> list[int]:
    """n TCP ports on 127.0.0.1 that were free a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def worker_env(rank: int, procs: int, ports: list[int]) -> dict[str, str]:
    """What worker ``rank`` of ``procs`` on this host gets on top of the job's environment: TF_CONFIG naming all of them on
    127.0.0.1 at ``ports``, its index, RANK and WORLD_SIZE (tasks.common.process.workers starts them so)."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}}), "RANK": str(rank), "WORLD_SIZE": str(procs)}


def _tensorflow_rank_env(env: dict[str, str], rank: int, procs: int, ports: list[int]) -> dict[str, str]:
    return worker_env(rank, procs, ports)


def _jax_env(device: str, world_size: int | None) -> dict[str, str]:
    # the platform fixed before jax starts (cpu runs do not open a GPU); no grab of most of a GPU's memory at start
    return {"JAX_PLATFORMS": {"cpu": "cpu", "cuda": "cuda", "xla": "tpu"}[device], "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


@dataclass(frozen=True)
class Framework:
    name: str
    runtime: str  # module with open_runtime(plan) -> the loop's Runtime, imported only in its own child
    probe: str  # 'module:function' of its device probe, (job) -> {"device", "world_size", "memory_bytes"} (tasks.common.runtimes.probe)
    checkpoint: str  # the file the runtime writes after every epoch, beside the run's job file
    checkpoint_format: str  # how that file is written: 'torch' (torch.save's zip) or 'npz' (arrays, the history as JSON)
    # how a job's processes map onto the devices of one host: 'device' (one process per device: DDP; one for xla's SPMD),
    # 'host' (one process drives every device), 'strategy' (one process, unless the strategy is multiworker: one per device)
    processes: str
    env: Callable[[str, int | None], dict[str, str]]  # (device, world size) -> the child's environment, set before the framework loads
    resolve_strategy: Callable = _auto  # (spec, world) -> the strategy a run uses ('auto' where the framework has none to choose)
    strategies: tuple[str, ...] = ("auto",)  # the spec's strategy values it takes
    strategy_words: str = ""  # what its auto does, for the error that refuses another strategy
    precisions: tuple[str, ...] = ("fp32",)
    # several hosts of a SLURM allocation: '' none; 'rendezvous' (srun starts one task per host, each a local launcher joining
    # one c10d rendezvous); 'workers' (srun starts one task per worker, its cluster from TF_CONFIG)
    hosts: str = ""
    host_strategies: tuple[str, ...] = ("auto",)  # the strategies it takes over several hosts
    local_launcher: tuple[str, ...] = ()  # python -m MODULE ARGS that starts N processes on this host ({procs} is N); () where it needs none
    # (the job's environment, rank, procs, free ports of 127.0.0.1, one per process) -> what that launcher would add to it for
    # each of its processes: the processes are then forked from a warm server instead (tasks.common.process.warm.ForkedGroup)
    rank_env: Callable[[dict[str, str], int, int, list[int]], dict[str, str]] | None = None
    check_device: Callable | None = None  # (spec) -> None; ValueError for a strategy that does not suit the spec's device or world
    preload: tuple[str, ...] = ()  # its modules a warm server may import for its jobs, none reading the job's environment on import (tasks.common.process.warm)
    # modules a warm server may import for its cpu jobs in their environment (``env("cpu")``): those whose jobs' variables
    # starting with an ``import_env`` prefix (what the framework reads on import) are what that environment gives
    cpu_preload: tuple[str, ...] = ()
    import_env: tuple[str, ...] = ()
    first_import: str = ""  # 'module:function' a job process calls before its body: the framework loaded as it should load there

    def procs(self, device: str, world: int, strategy: str) -> int:
        """Processes a run of ``world`` devices launches on each host."""
        if self.processes == "device":
            return 1 if device == "xla" else world
        if self.processes == "strategy":
            return world if strategy == "multiworker" else 1
        return 1

    def strategy_of(self, requested: str) -> str:
        """The strategy a benchmark's cell in this framework trains with: the benchmark's ``requested`` one where this
        framework takes it, else auto (a benchmark's train section names one strategy for every framework)."""
        return requested if requested in self.strategies else "auto"

    def check(self, spec) -> None:
        """ValueError for a strategy, precision or host count this framework does not take (a TrainSpec's validator calls it)."""
        if spec.strategy not in self.strategies:
            owners = " and ".join(f.name for f in FRAMEWORKS.values() if spec.strategy in f.strategies)
            raise ValueError(f"strategy {spec.strategy} is {owners}'s; {self.name} takes {self.strategy_words or ', '.join(self.strategies)}")
        if spec.precision not in self.precisions:
            raise ValueError(f"precision {spec.precision}: the {self.name} version trains in {' or '.join(self.precisions)} only")
        if spec.hosts > 1:
            if not self.hosts or spec.device == "xla":
                several = " or ".join(f.name for f in FRAMEWORKS.values() if f.hosts)
                raise ValueError(f"--hosts {spec.hosts}: several hosts train {several} on cpu or cuda")
            if spec.strategy not in self.host_strategies:
                raise ValueError(f"--hosts {spec.hosts}: {self.name} spreads over hosts with strategy {' (or '.join(reversed(self.host_strategies))}), "
                                 f"not {spec.strategy}")
        if self.check_device:
            self.check_device(spec)

    def launcher(self, procs: int, hosts: int = 1, folder: str = "") -> list[str]:
        """The command that starts a job's processes before ``-m MODULE ARGS``: python itself for one process on one host;
        the framework's local launcher for ``procs`` on this host (its own files, such as torchrun's log folders, in the
        job's ``folder``, which goes with the job); srun over ``hosts`` hosts of a SLURM allocation, each task starting its
        share through tasks.common.process.hosts."""
        if hosts > 1:
            tasks_per_host = procs if self.hosts == "workers" else 1
            return ["srun", f"--nodes={hosts}", f"--ntasks={hosts * tasks_per_host}", f"--ntasks-per-node={tasks_per_host}", "--kill-on-bad-exit=1",
                    sys.executable, "-m", "tasks.common.process.hosts", self.name, str(procs), str(free_ports(1)[0])]
        if procs == 1:
            return [sys.executable]
        if not self.local_launcher:
            raise UserError(f"{self.name} drives all its devices from one process; it launches no {procs} processes")
        if not folder:
            raise ValueError(f"{self.name}'s launcher of {procs} processes needs the job's folder")
        return [sys.executable, *(part.format(procs=procs, python=sys.executable, folder=folder) for part in self.local_launcher)]


FRAMEWORKS = {
    "torch": Framework(
        "torch", "tasks.common.runtimes.runtime_torch", "tasks.common.runtimes.probe:probe_torch", "checkpoint.pt", "torch", processes="device",
        env=_torch_env, strategy_words="auto (DDP on cpu and cuda, SPMD on xla)", precisions=("fp32", "bf16"), hosts="rendezvous",
        local_launcher=("-m", "torch.distributed.run", "--standalone", "--nproc-per-node={procs}", "--log-dir={folder}/torchrun"), rank_env=_torch_rank_env,
        preload=("torch", "torch.nn", "torch.optim", "torch._dynamo")),
    "tensorflow": Framework(
        "tensorflow", "tasks.common.runtimes.runtime_keras", "tasks.common.runtimes.probe:probe_tensorflow", "checkpoint.npz", "npz", processes="strategy",
        env=_tensorflow_env, resolve_strategy=_tensorflow_strategy, strategies=("auto", "default", "mirrored", "multiworker", "tpu"),
        hosts="workers", host_strategies=("auto", "multiworker"), check_device=_tensorflow_check, local_launcher=("-m", "tasks.common.process.workers", "{procs}", "{python}"),
        rank_env=_tensorflow_rank_env, cpu_preload=("tasks.common.runtimes.tensorflow_preload",), import_env=("TF_", "KERAS_", "CUDA_", "XLA_", "ONEDNN_", "DNNL_"),
        first_import="tasks.common.runtimes.tensorflow_import:import_tensorflow"),
    "jax": Framework(
        "jax", "tasks.common.runtimes.runtime_jax", "tasks.common.runtimes.probe:probe_jax", "checkpoint.npz", "npz", processes="host",
        env=_jax_env, strategy_words="auto (its devices in one process, the batch split over them)",
        cpu_preload=("tasks.common.runtimes.jax_preload",), import_env=("JAX_",)),
}


def framework(name: str) -> Framework:
    """The framework ``name``; UserError listing the valid names for any other."""
    if name not in FRAMEWORKS:
        raise UserError(f"unknown framework {name!r}; choose one of {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[name]


def order(name: str) -> tuple[bool, str]:
    """A sort key for frameworks: the default (the base others are compared with) first, then by name."""
    return name != DEFAULT, name


def open_runtime(plan):
    """The plan's framework on its device, for this rank (imports the framework)."""
    return importlib.import_module(framework(plan.framework).runtime).open_runtime(plan)


def call(target: str, *args):
    """Call 'module:function' (a table entry's probe) with ``args``, importing the module."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)(*args)


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
