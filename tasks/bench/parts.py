"""bench-train and bench-infer: a workload's own timing of its training step and of its rollout step; imports no Prefect or MLflow.

Both reach the workload's part through the workload table (``Workload.bench_train``, ``Workload.bench_infer``); a
workload without one is refused in one line naming those that have one."""

from tasks.bench.specs import BenchInferSpec, BenchTrainSpec
from tasks.workloads import get_workload, part_of


def bench_train(spec: BenchTrainSpec, seed: int = 0) -> dict:
    """Training samples/s of ``spec``'s workload against a plain step, by its bench-train part."""
    return part_of(get_workload(spec.workload), "bench_train", "bench-train")(spec, seed)


def bench_infer(spec: BenchInferSpec, seed: int = 0) -> dict:
    """Frames/s of one rollout step of ``spec``'s workload against the solver, by its bench-infer part."""
    return part_of(get_workload(spec.workload), "bench_infer", "bench-infer")(spec, seed)
