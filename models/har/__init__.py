"""The har workload's pure computation: the stacked bidirectional LSTM in each framework (torch.py, keras.py, jax.py) over one weight layout (layout.py)."""
