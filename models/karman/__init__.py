"""The karman workload's pure computation: the lattice-Boltzmann flow solver, the Pix2Pix surrogate in three frameworks, its recipes, tiling, inference and flow metrics."""
