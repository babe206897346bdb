"""Child body of the bench-frameworks tests: per workload, our trainer and the framework's idiomatic reference from the same weights, their losses on one batch before and after one optimiser step; prints them as JSON.

Run as ``python -m tests.tasks.bench.frameworks_step FRAMEWORK``, one process per framework (tensorflow and jax
apart), with the framework's device environment (tasks.common.launch.device_env).
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


def stepped(framework: str, workload: str, batch: int = 24) -> dict:
    """Ours and the reference on one batch of ``batch`` samples: the loss before, and after one step on that batch."""
    from tasks.bench.references import reference_module
    from tasks.common.specs import TrainSpec
    from tasks.workloads import framework_module, get_workload

    data, sizes = {"digits": _digits, "har": _har}[workload](batch)
    spec = TrainSpec(workload=workload, dataset=workload, framework=framework, seed=3, **sizes)
    trainer = framework_module(get_workload(workload), framework).build(data, spec, batch, runtime_of(framework))
    x, y = data.x["train"], data.y["train"]
    reference = reference_module(workload, framework).Reference(spec, trainer.weights(), x, y, batch)
    before = {"ours": trainer.score("train")["loss"], "reference": reference.loss(x, y)}
    trainer.step(next(trainer.batches(1, 1)), [0.0] * 3, 0.0)
    seconds = reference.train(1)
    after = {"ours": trainer.score("train")["loss"], "reference": reference.loss(x, y)}
    return {"before": before, "after": after, "seconds": seconds, "words": reference.words}


if __name__ == "__main__":
    print(json.dumps({workload: stepped(sys.argv[1], workload) for workload in ("digits", "har")}))
