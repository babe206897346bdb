"""The probe job (child process): can this framework open this device here, how many, with how much memory; shared by every stage that plans device work."""

BODY = "tasks.common.probe:probe_device"


def probe_device(job: dict) -> dict:
    """{"device": its name, "world_size": devices, "memory_bytes": one device's memory or None};
    DeviceUnavailable names what is missing."""
    if job.get("framework", "torch") == "jax":
        from tasks.common.training.runtime_jax import resolve_jax

        ctx = resolve_jax(job["device"])
        stats = ctx.device.memory_stats() if job["device"] != "cpu" else None
        return {"device": ctx.description, "world_size": ctx.world_size, "memory_bytes": (stats or {}).get("bytes_limit")}
    if job.get("framework", "torch") == "tensorflow":
        import tensorflow as tf

        from models.device_keras import resolve_strategy

        strategy = "tpu" if job["device"] == "xla" else "mirrored" if job["device"] == "cuda" else "default"
        gpus = len(tf.config.list_physical_devices("GPU")) if job["device"] == "cuda" else 1
        ctx = resolve_strategy(job["device"], strategy, max(gpus, 1))
        return {"device": ctx.description, "world_size": ctx.world_size, "memory_bytes": None}
    import torch

    from models.device import resolve_device

    ctx = resolve_device(job["device"])
    memory = torch.cuda.get_device_properties(ctx.device).total_memory if ctx.kind == "cuda" else None
    return {"device": ctx.description, "world_size": ctx.world_size, "memory_bytes": memory}
