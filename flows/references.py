"""``python -m flows rcp``: a workload's reference convergence points, trained through the benchmark and written into its folder's convergence.json."""

from tasks.common.config.settings import Settings
from tasks.report.convergence import ConvergenceSpec, write_references


def make_references(spec: ConvergenceSpec) -> dict:
    """Run the benchmark of ``spec`` (its finished cells are reused, as any benchmark's are), then write the references from its
    training runs; returns where they went and each point's epochs."""
    from flows import pipeline

    bench = pipeline.benchmark(spec.benchmark_spec())
    return write_references(Settings.from_env(), spec, bench) | {"report": bench["report"], "failed": bench["failed"]}
