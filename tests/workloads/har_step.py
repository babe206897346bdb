"""Child body of the har tests: one framework's trainer takes one Adam step on a fixed batch of synthetic windows (and one at the end of a cosine schedule); its parameter count, the losses and the rates.

Each framework's step runs as a job of its own (tests.workloads.digits_step.stepped_in_children), with the framework's
device environment (tasks.common.process.launch.device_env); ``python -m tests.workloads.har_step FRAMEWORK`` prints the same as JSON.
"""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from tests.workloads.digits_step import runtime_of

NETWORK = {"layers": 2, "units": 8}  # small: the same shapes' code as the default's, at a fraction of its cost


def one_step(framework: str, batch: int = 24) -> dict:
    """Losses on ``batch`` synthetic windows (4 of each activity, 1 subject) before and after one step of the framework's trainer (seed 0)."""
    from tasks.common.specs import TrainSpec
    from tasks.workloads import framework_module, get_workload
    from tasks.workloads.har.synthetic import synthesize
    from tasks.workloads.har.workload import HarData

    x, y, _ = synthesize(per_activity=batch // 6, subjects=1)  # (b, 128, 9), (b,)
    y = y.astype(np.int64)
    data = HarData({role: x for role in ("train", "val", "test")}, {role: y for role in ("train", "val", "test")}, {}, "-", 0.85)
    spec = TrainSpec(workload="har", dataset="har", framework=framework, seed=0, **NETWORK)
    module = framework_module(get_workload("har"), framework)
    trainer = module.build(data, spec, batch, runtime_of(framework))
    before = trainer.score("train")["loss"]
    step_losses, flags = trainer.step(next(trainer.batches(1, 1)), [0.0, 0.0, 1.5], 0.0)
    weights = trainer.weights()
    runtime = trainer.runtime
    with tempfile.TemporaryDirectory() as tmp:  # the checkpoint round trip: a fresh trainer takes the stepped one's state
        path = Path(tmp) / runtime.checkpoint
        runtime.save({"model": trainer.state(), "history": {"epoch": 1}}, path)
        fresh = module.build(data, spec.model_copy(update={"seed": 1}), batch, runtime)
        fresh.load_state(runtime.load(path)["model"])
        restored = all(np.array_equal(weights[k], v) for k, v in fresh.weights().items())
        batch2 = next(trainer.batches(2, 1))  # one batch for both: the other seed would order it otherwise (and round otherwise)
        second = [trainer.step(batch2, [0.0] * 3, 0.0)[0]["loss_ce"],
                  fresh.step(batch2, [0.0] * 3, 0.0)[0]["loss_ce"]]  # Adam's moments came along too
    # the schedule: one step at the run's end under cosine takes Adam's first step, each weight moved by the rate, which is
    # a hundredth of the initial one there
    late = module.build(data, spec.model_copy(update={"options": spec.options.model_copy(update={"schedule": "cosine"})}), batch, runtime)
    start = late.weights()
    late.step(next(late.batches(1, 1)), [0.0] * 3, 1.0)
    moved = max(float(np.abs(v - start[k]).max()) for k, v in late.weights().items())
    trained = trainer.net.parameters() if framework == "torch" else trainer.w.values() if framework == "jax" else trainer.net.trainable_variables
    counted = sum(int(np.prod(tuple(p.shape))) for p in trained if getattr(p, "requires_grad", True))
    return {"restored": restored, "second_steps": second, "parameters": int(sum(v.size for v in weights.values())), "trainable": counted,
            "params": trainer.params["parameters"], "before": before, "step_loss": step_losses["loss_ce"], "after": trainer.score("train")["loss"],
            "flags": flags, "scores": trainer.score("train"), "rate": trainer.learning_rate(), "late_rate": late.learning_rate(), "late_moved": moved}


def result(framework: str) -> dict:
    return one_step(framework)


if __name__ == "__main__":
    from tasks.common.process.job_main import load

    load(sys.argv[1])  # the framework loaded as a job loads it
    print(json.dumps(result(sys.argv[1])))
