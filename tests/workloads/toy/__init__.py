"""A small test workload: two-class points, an MLP in torch (see workload.py)."""
