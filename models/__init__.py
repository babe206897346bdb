"""Pure computation, one folder per workload (karman/, calo/, har/, digits/), and the helpers they share: the learning-rate schedule and the device helpers.

Nothing in this package touches Prefect, MLflow, zarr or the file system.
"""
