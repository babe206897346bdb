"""The probe job (child process): can this framework open this device here, how many, with how much memory; shared by every stage that plans device work.

Each framework's probe is named by its entry in the framework table (``Framework.probe``)."""

from tasks.common.config.frameworks import DEFAULT, call, framework

BODY = "tasks.common.runtimes.probe:probe_device"


def probe_device(job: dict) -> dict:
    """{"device": its name, "world_size": devices, "memory_bytes": one device's memory or None};
    DeviceUnavailable names what is missing."""
    return call(framework(job.get("framework", DEFAULT)).probe, job["device"])


def probe_torch(device: str) -> dict:
    import torch

    from models.device import resolve_device

    ctx = resolve_device(device)
    memory = torch.cuda.get_device_properties(ctx.device).total_memory if ctx.kind == "cuda" else None
    return {"device": ctx.description, "world_size": ctx.world_size, "memory_bytes": memory}


def probe_tensorflow(device: str) -> dict:
    import tensorflow as tf

    from models.device_keras import resolve_strategy

    strategy = "tpu" if device == "xla" else "mirrored" if device == "cuda" else "default"
    gpus = len(tf.config.list_physical_devices("GPU")) if device == "cuda" else 1
    ctx = resolve_strategy(device, strategy, max(gpus, 1))
    return {"device": ctx.description, "world_size": ctx.world_size, "memory_bytes": None}


def probe_jax(device: str) -> dict:
    from tasks.common.runtimes.runtime_jax import resolve_jax

    ctx = resolve_jax(device)
    stats = ctx.device.memory_stats() if device != "cpu" else None
    return {"device": ctx.description, "world_size": ctx.world_size, "memory_bytes": (stats or {}).get("bytes_limit")}
