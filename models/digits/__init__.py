"""The digits workload's pure computation: the MNIST CNN in each framework (torch.py, keras.py, jax.py)."""
