"""Units of work with their I/O: one simulation sweep into zarr, one training run, one rollout,
one aggregation. MLflow and zarr access live here, behind small helpers."""
