"""Child body of the digits tests: one framework's trainer takes one optimiser step on a fixed batch; its parameter count and the losses.

Each framework's step runs as a job of its own (``stepped_in_children``: tensorflow and jax never share a process), with
the framework's device environment (tasks.common.process.launch.device_env); ``python -m tests.workloads.digits_step FRAMEWORK``
prints the same as JSON.
"""

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np


def step_env(framework: str, fast_compile: bool = True) -> dict[str, str]:
    """The environment of a child that takes a few steps in ``framework`` on one CPU thread: the framework's device
    environment, the project on the path, and for JAX, unless ``fast_compile`` is off, XLA without LLVM's
    optimisations (tests/conftest.py's XLA_FAST_COMPILE: most of such a child's CPU is XLA compiling)."""
    import os

    from tasks.common.process.launch import device_env
    from tests.conftest import ROOT, XLA_FAST_COMPILE

    return {**os.environ, **device_env("cpu", framework=framework), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            **(XLA_FAST_COMPILE if fast_compile and framework == "jax" else {})}


def stepped_in_children(module: str, frameworks: tuple[str, ...], fast_compile: bool = True) -> dict[str, dict]:
    """``module.result(FRAMEWORK)`` for each framework, each in a job process of its own with its ``step_env``, started as
    the benchmark starts its training jobs (tasks.common.process.launch.run_child: forked from a warm server that has imported the
    framework where the framework table lets it, as a training job's process is, instead of a fresh interpreter importing
    TensorFlow, about 12 s of CPU, for each module's step), one after the other."""
    import logging

    from tasks.common.process.launch import run_child

    log = logging.getLogger("karman.test")
    return {framework: run_child("bench", STEP_BODY, {"module": module}, log, env=step_env(framework, fast_compile), framework=framework)
            for framework in frameworks}


def stepped_when_asked(module: str, fast_compile: bool = True, env: dict[str, str] | None = None) -> Callable[[str], dict]:
    """``stepped_in_children`` one framework at a time: a framework's result is taken when first asked for and kept, so
    that a module's tests each wait for the frameworks they compare, not for all of them before the first. ``env`` is set
    in this process while a child starts (the children inherit it)."""
    import pytest

    taken: dict[str, dict] = {}

    def of(framework: str) -> dict:
        if framework not in taken:
            with pytest.MonkeyPatch.context() as patch:
                for key, value in (env or {}).items():
                    patch.setenv(key, value)
                taken[framework] = stepped_in_children(module, (framework,), fast_compile)[framework]
        return taken[framework]

    return of


STEP_BODY = "tests.workloads.digits_step:step_body"


def step_body(job: dict) -> dict:
    """Job body (tasks.common.process.job_main): the step module's ``result`` for the job's framework, which the job process has
    loaded as a training job loads it."""
    import importlib

    return importlib.import_module(job["module"]).result(job["framework"])


def runtime_of(framework: str):
    """The framework's runtime on one CPU device, as the training job opens it."""
    if framework == "torch":
        from tasks.common.runtimes.runtime_torch import TorchRuntime

        return TorchRuntime("cpu", threads=1)
    if framework == "tensorflow":
        from tasks.common.runtimes.runtime_keras import KerasRuntime

        return KerasRuntime("cpu", "default", 1, threads=1)
    from tasks.common.runtimes.runtime_jax import JaxRuntime

    return JaxRuntime("cpu", threads=1)


def one_step(framework: str, batch: int = 32) -> dict:
    """Losses on the first ``batch`` digits before and after one step of the framework's trainer (seed 0)."""
    from tasks.common.specs import TrainSpec
    from tasks.workloads import framework_module, get_workload
    from tasks.workloads.digits.workload import DigitsData, read_source, source_file

    images, labels = read_source(source_file())
    take = np.linspace(0, len(labels) - 1, batch).astype(int)  # the file is sorted by class: spread over it
    x = (images[take].astype(np.float32) / 255.0)[..., None]  # (b, 28, 28, 1)
    y = labels[take].astype(np.int64)
    data = DigitsData({role: x for role in ("train", "val", "test")}, {role: y for role in ("train", "val", "test")}, {}, "-", 0.95)
    spec = TrainSpec(workload="digits", dataset="digits", framework=framework, seed=0)
    trainer = framework_module(get_workload("digits"), framework).build(data, spec, batch, runtime_of(framework))
    before = trainer.score("train")["loss"]
    step_losses, flags = trainer.step(next(trainer.batches(1, 1)), [0.0, 0.0, 1.5], 0.0)
    weights = trainer.weights()
    runtime = trainer.runtime
    with tempfile.TemporaryDirectory() as tmp:  # the checkpoint round trip: a fresh trainer takes the stepped one's state
        path = Path(tmp) / runtime.checkpoint
        runtime.save({"model": trainer.state(), "history": {"epoch": 1}}, path)
        fresh = framework_module(get_workload("digits"), framework).build(data, spec.model_copy(update={"seed": 1}), batch, runtime)
        fresh.load_state(runtime.load(path)["model"])
        restored = all(np.array_equal(weights[k], v) for k, v in fresh.weights().items())
        # one batch for both: the fresh trainer's other seed would order it otherwise, and a sum in another order
        # rounds otherwise on some hosts; what must be equal is the state the checkpoint carried
        batch2 = next(trainer.batches(2, 1))
        second = [trainer.step(batch2, [0.0] * 3, 0.0)[0]["loss_ce"],
                  fresh.step(batch2, [0.0] * 3, 0.0)[0]["loss_ce"]]  # the optimiser's momentum came along too
    return {"restored": restored, "second_steps": second, "parameters": int(sum(v.size for v in weights.values())), "params": trainer.params["parameters"], "before": before,
            "step_loss": step_losses["loss_ce"], "after": trainer.score("train")["loss"], "flags": flags,
            "flops_per_sample": trainer.flops_per_sample}


def result(framework: str) -> dict:
    return one_step(framework)


if __name__ == "__main__":
    from tasks.common.process.job_main import load

    load(sys.argv[1])  # the framework loaded as a job loads it
    print(json.dumps(result(sys.argv[1])))
