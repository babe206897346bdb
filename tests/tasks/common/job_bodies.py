"""Job bodies for the tests of the parent-child protocol: they say misleading things in their log and the truth in events; one opens an MLflow run."""

import logging

from tasks.common.process import events
from tasks.common.config.errors import RunFailed

log = logging.getLogger("karman.test")


def chatty_failure(job: dict) -> dict:
    """Log lines that look like the old progress and verdict lines, events that say otherwise, then fail."""
    log.info("epoch 1: 3.0 s; 90% done")
    events.emit(events.PROGRESS, fraction=0.25, epoch=1, step=1, steps=4)
    log.info("error: this line is only words")
    events.emit(events.PROGRESS, fraction=0.5, epoch=1, step=2, steps=4)
    print("stopped: neither is this one", flush=True)
    raise RunFailed(job["reason"])


def chatty_success(job: dict) -> dict:
    """Words that read like a failure, and a result."""
    log.info("failed: the loss diverged (not really)")
    print("crashed: nothing did", flush=True)
    events.emit(events.PROGRESS, fraction=1.0, epoch=2, step=None, steps=None)
    return {"answer": 42, "missing": float("nan")}


def open_run(job: dict) -> dict:
    """Open (and close) an MLflow run, as a child job of a flow run; say whether Prefect was loaded here."""
    import sys

    from tasks.common.config.settings import Settings
    from tasks.common.tracking.runs import mlflow_run

    with mlflow_run(Settings.from_env(), "linktest", "link-child", description="A run opened by a child job.") as run:
        pass
    return {"run_id": run.run_id, "prefect_loaded": "prefect" in sys.modules}


def describe(job: dict) -> dict:
    """What the process it runs in looks like: its pid and parent, folder, an environment variable, torch's thread count and
    whether torch was already loaded when the body began, a fresh random draw, whether the cycle collector runs and how
    many objects it leaves alone (frozen), whether MLflow's map of the installed distributions was there before the body
    asked for it."""
    import gc
    import os
    import random
    import sys

    loaded = "torch" in sys.modules
    requirements = sys.modules.get("mlflow.utils.requirements_utils")
    mapped = requirements is not None and requirements._MODULES_TO_PACKAGES is not None
    import torch

    print(f"line from {os.getpid()}", flush=True)
    return {"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "value": os.environ.get("KARMAN_TEST_VALUE"),
            "threads": torch.get_num_threads(), "torch_preloaded": loaded, "draw": random.random(),
            "collector": gc.isenabled(), "frozen": gc.get_freeze_count(), "distributions_mapped": mapped}


def die(job: dict) -> dict:
    """End as a process killed by ``job['signal']`` ends."""
    import os

    os.kill(os.getpid(), job["signal"])
    return {}


def describe_tensorflow(job: dict) -> dict:
    """Whether a warm server had loaded TensorFlow before it forked the job, whether the packages TensorFlow loads only
    because they are installed were left out, what it computes here (oneDNN's choice as the job's environment says it),
    and (``import_later``) whether those packages still import afterwards."""
    import os
    import sys

    preloaded = "tasks.common.runtimes.tensorflow_preload" in sys.modules
    skipped = {name: name not in sys.modules for name in ("jax", "sklearn")}
    import tensorflow as tf

    later = {}
    if job.get("import_later"):
        import jax
        import sklearn

        later = {"jax": jax.__version__, "sklearn": sklearn.__version__}
    return {"ppid": os.getppid(), "tensorflow_preloaded": preloaded, "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
            "sum": float(tf.reduce_sum(tf.range(10.0)).numpy()), "skipped": skipped, "later": later}


def describe_jax(job: dict) -> dict:
    """Whether a warm server had imported JAX before it forked the job, the platform and compilation cache JAX read on
    import, and what the job's own backend does once the job has set XLA's flags (``job['devices']`` host devices)."""
    import os
    import sys

    preloaded = "tasks.common.runtimes.jax_preload" in sys.modules
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={job['devices']}"  # read when the backend starts, here
    import jax
    import jax.numpy as jnp

    return {"ppid": os.getppid(), "jax_preloaded": preloaded, "platforms": jax.config.jax_platforms,
            "cache": jax.config.jax_compilation_cache_dir, "devices": len(jax.devices()), "sum": float(jnp.arange(10.0).sum())}


def all_reduce(job: dict) -> dict:
    """One rank of a torch job of several: it says who it is, joins the process group from its environment (as DDP's do),
    sums its rank + 1 over the group (rank 0 says the sum); rank ``job['fail_rank']`` fails at once instead, and the others then wait.
    With ``job['lines']``, each rank prints that many lines once the group has met."""
    import os
    import time

    rank = int(os.environ["RANK"])
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} in {os.getpid()}", flush=True)
    if job.get("fail_rank") is not None:
        if rank == job["fail_rank"]:
            raise RunFailed("this rank gave up")
        time.sleep(120)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    for line in range(job.get("lines", 0)):  # after the group's rendezvous, so that the ranks print at the same time
        print(f"rank {rank} line {line:04d} " + "x" * 60)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    world = dist.get_world_size()
    dist.destroy_process_group()
    if rank != 0:
        return None  # rank 0 writes the result
    return {"sum": total.item(), "rank": rank, "world": world, "ppid": os.getppid(), "threads": torch.get_num_threads(),
            "local_rank": int(os.environ["LOCAL_RANK"])}


def slow_stop(job: dict) -> dict:
    """A rank of a training job that stops when signalled, as the loop does at the end of a step; rank 0 takes
    ``job['linger']`` s longer (it closes the run) than the others."""
    import os
    import time

    from tasks.common.process import lifetime
    from tasks.common.config.errors import RunStopped

    print("ready", flush=True)
    while lifetime.stop_requested() is None:
        time.sleep(0.05)
    if os.environ.get("RANK") == "0":
        time.sleep(job["linger"])
    raise RunStopped(f"stopped by signal {lifetime.stop_requested()}")
