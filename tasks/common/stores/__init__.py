"""The data a run reads and writes on disk: the zarr dataset store, a workload's dataset written once, and a training run's model files."""
