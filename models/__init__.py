"""Pure computation: the lattice-Boltzmann flow solver and the Pix2Pix networks.

Nothing in this package touches Prefect, MLflow, zarr or the file system.
"""
