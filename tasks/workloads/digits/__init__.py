"""The digits workload: one small CNN classifying 5,000 real MNIST digits, the same network and hyper-parameters in torch, tensorflow and jax."""
