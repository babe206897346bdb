"""The digits CNN as each framework's documentation teaches it: a plain PyTorch loop, Keras' Model.fit, and JAX with optax."""
