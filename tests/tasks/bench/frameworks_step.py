"""Child body of the bench-frameworks tests: per workload, our trainer and the framework's idiomatic reference from the same weights, their losses on one batch before and after one optimiser step.

Each framework's steps run as a job of its own (tests.workloads.digits_step.stepped_in_children: tensorflow and jax
apart), with the framework's device environment (tasks.common.process.launch.device_env); karman reads the tiny sweep
``KARMAN_DATASET`` of the data root in the environment (the tests write it). ``python -m tests.tasks.bench.frameworks_step
FRAMEWORK`` prints the same as JSON.
"""

import json
import sys

import numpy as np

from tests.workloads.digits_step import runtime_of


def _digits(batch: int):
    from tasks.workloads.digits.workload import DigitsData, read_source, source_file

    images, labels = read_source(source_file())
    take = np.linspace(0, len(labels) - 1, batch).astype(int)  # the file is sorted by class: spread over it
    x, y = (images[take].astype(np.float32) / 255.0)[..., None], labels[take].astype(np.int64)  # (b, 28, 28, 1), (b,)
    return DigitsData({r: x for r in ("train", "val", "test")}, {r: y for r in ("train", "val", "test")}, {}, "-", 0.95), {}


def _har(batch: int):
    from tasks.workloads.har.workload import HarData, synthesize

    x, y, _ = synthesize(per_activity=batch // 6, subjects=1)  # (b, 128, 9), (b,): synthetic windows
    y = y.astype(np.int64)
    return HarData({r: x for r in ("train", "val", "test")}, {r: y for r in ("train", "val", "test")}, {}, "-", 0.85), {"layers": 2, "units": 8}


def _karman(framework: str):
    """The tiny sweep's training pairs, all in one batch, under the default recipe without its input noise (the sides draw
    their own), so that one step is the same step in both."""
    import os

    from tasks.common.config.settings import Settings
    from tasks.common.specs import TrainSpec
    from tasks.workloads import get_workload

    spec = TrainSpec(workload="karman", dataset=os.environ["KARMAN_DATASET"], framework=framework, seed=3, noise=0.0, validate_every=0, threads=1)
    data = get_workload("karman").prepare(Settings.from_env(), spec)
    return data, spec, len(data.train)


def _classifier(framework: str, workload: str, batch: int = 24):
    from tasks.common.specs import TrainSpec

    data, sizes = {"digits": _digits, "har": _har}[workload](batch)
    return data, TrainSpec(workload=workload, dataset=workload, framework=framework, seed=3, **sizes), batch


def stepped(framework: str, workload: str) -> dict:
    """Ours and the reference on one batch (all the training samples): the loss before, and after one step on that batch."""
    from tasks.workloads import framework_module, get_workload, reference_module

    data, spec, batch = _karman(framework) if workload == "karman" else _classifier(framework, workload)
    runtime = runtime_of(framework)
    runtime.seed_epoch(spec.seed, 1)
    found = get_workload(workload)
    trainer = framework_module(found, framework).build(data, spec, batch, runtime)
    module = reference_module(found, framework)
    x, y = module.arrays(data)
    reference = module.Reference(spec, module.ours_weights(trainer), x, y, batch)
    before = {"ours": module.ours_loss(trainer, x, y), "reference": reference.loss(x, y)}
    trainer.step(next(trainer.batches(1, 1)), [0.0] * 3, 0.0)
    seconds = reference.train(1)
    after = {"ours": module.ours_loss(trainer, x, y), "reference": reference.loss(x, y)}
    return {"before": before, "after": after, "seconds": seconds, "words": reference.words}


def result(framework: str) -> dict:
    return {workload: stepped(framework, workload) for workload in ("digits", "har", "karman")}


if __name__ == "__main__":
    from tasks.common.process.job_main import load

    load(sys.argv[1])  # the framework loaded as a job loads it
    print(json.dumps(result(sys.argv[1])))
