"""Stage generate: the sweep of reference simulations into zarr (task.py, flow process) and one simulation (simulation.py, on a Dask worker)."""
