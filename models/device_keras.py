"""The TensorFlow device helper: a device kind and a strategy name resolved to a tf.distribute strategy, before TensorFlow starts its runtime.

Strategies by name:

- ``default``: one device (the CPU, or the first GPU);
- ``mirrored``: MirroredStrategy over the world's devices in one process: GPUs, or on ``cpu`` that
  many logical CPU devices sharing the host's cores (how the strategy is exercised without GPUs);
- ``multiworker``: MultiWorkerMirroredStrategy, one process per device, the cluster described in
  TF_CONFIG by the launcher (tasks.common.config.frameworks); each process one device;
- ``tpu``: TPUStrategy on a TPU host (its cores are the replicas).

Call ``resolve_strategy`` before anything else touches TensorFlow's devices: logical devices and
thread pools are fixed once the runtime starts.
"""

import json
import os
from dataclasses import dataclass

import tensorflow as tf

from models.host import DeviceUnavailable

STRATEGIES = ("default", "mirrored", "multiworker", "tpu")


@dataclass
class KerasContext:
    strategy: tf.distribute.Strategy
    name: str  # default | mirrored | multiworker | tpu
    kind: str  # cpu | cuda | xla (a TPU)
    description: str
    world_size: int  # replicas in sync over every process
    workers: int = 1  # processes (multiworker), else 1
    rank: int = 0  # this process's index among the workers

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def local_replicas(self) -> int:
        return self.world_size // self.workers


def resolve_strategy(device: str, strategy: str, world: int, threads: int | None = None) -> KerasContext:
    """The strategy ``strategy`` over ``world`` replicas of ``device``; DeviceUnavailable names what
    the host lacks."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown tensorflow strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(threads, 2))
    if strategy == "tpu" or device == "xla":
        return _tpu()
    if device == "cuda":
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise DeviceUnavailable("device cuda: TensorFlow sees no GPU (is tensorflow[and-cuda] installed from requirements-tensorflow-gpu.txt, "
                                    "and a GPU visible?)")
        for gpu in gpus:  # allocate as needed, so that the peak memory is the run's own
            tf.config.experimental.set_memory_growth(gpu, True)
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
        if strategy == "mirrored":
            if world > len(gpus):
                raise DeviceUnavailable(f"mirrored over {world} GPUs, but TensorFlow sees {len(gpus)}")
            devices = [f"/gpu:{i}" for i in range(world)]
            return KerasContext(tf.distribute.MirroredStrategy(devices), strategy, "cuda", f"{world}x {name} (mirrored)", world)
        if strategy == "multiworker":  # one GPU per worker process: the one of its index on this host (LOCAL_RANK over several hosts)
            rank = int(os.environ.get("LOCAL_RANK") or json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0))
            if rank >= len(gpus):
                raise DeviceUnavailable(f"worker {rank} has no GPU of its own: TensorFlow sees {len(gpus)}")
            tf.config.set_visible_devices(gpus[rank], "GPU")
            return _multiworker("cuda", name)
        return KerasContext(tf.distribute.OneDeviceStrategy("/gpu:0"), "default", "cuda", name, 1)
    cpu = tf.config.list_physical_devices("CPU")[0]
    label = f"cpu ({threads or os.cpu_count()} threads)"
    if strategy == "mirrored":
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * world)
        devices = [f"/cpu:{i}" for i in range(world)]
        return KerasContext(tf.distribute.MirroredStrategy(devices), strategy, "cpu", f"{world} logical CPUs on {label} (mirrored)", world)
    if strategy == "multiworker":
        return _multiworker("cpu", label)
    return KerasContext(tf.distribute.get_strategy(), "default", "cpu", label, 1)


def _multiworker(kind: str, name: str) -> KerasContext:
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    if not config.get("cluster", {}).get("worker"):
        raise DeviceUnavailable("strategy multiworker needs TF_CONFIG naming the workers (tasks.common.config.frameworks starts them)")
    workers, rank = len(config["cluster"]["worker"]), int(config["task"]["index"])
    options = tf.distribute.experimental.CommunicationOptions(implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    return KerasContext(strategy, "multiworker", kind, f"{workers} workers x {name} (multiworker)", strategy.num_replicas_in_sync, workers, rank)


def _tpu() -> KerasContext:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as exc:  # no TPU runtime or no TPU on this host
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DeviceUnavailable(f"strategy tpu needs a TPU host with tensorflow-tpu (requirements-tensorflow-tpu.txt); none found here ({reason})") from None
    tpu = tf.distribute.TPUStrategy(resolver)
    return KerasContext(tpu, "tpu", "xla", f"TPU x{tpu.num_replicas_in_sync}", tpu.num_replicas_in_sync)


def peak_memory_mb(ctx: KerasContext) -> float | None:
    """The device's peak memory in this process (GPU), None where TensorFlow does not say (CPU: the host's peak is used)."""
    if ctx.kind != "cuda":
        return None
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
