"""The calo workload's pure computation: the 3DGAN's shapes and weights (nets.py) and its networks per framework (torch.py, keras.py, jax.py), the synthetic showers and their shower-shape metrics."""
