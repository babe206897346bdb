"""Units of work with their I/O, one room per stage (generate, train, infer, report, validate), shared parts in common, the bench-… measurements in bench.

MLflow and zarr access live here, behind small helpers. In each stage, ``task.py`` and ``plan.py`` run in
the flow process and import no framework; ``job.py`` runs in the stage's child process.
"""
