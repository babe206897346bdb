"""The har workload in JAX (jit; data-parallel over the runtime's devices): the stacked bidirectional LSTM of workload.py as a pure function of its weights, optax Adam, logits for scoring."""

import jax
import jax.numpy as jnp
import optax

from tasks.common.training.classifier_jax import JaxClassifier
from tasks.workloads.har.workload import DIRECTIONS, EPSILON, LEARNING_RATE, HarData, HarTrainer


def _direction(x: jax.Array, kernel: jax.Array, recurrent: jax.Array, bias: jax.Array, reverse: bool) -> jax.Array:
    """One LSTM direction over windows (B, T, in) -> (B, T, H), gates i, f, c, o (workload.py's order), the
    input projection for every step at once, then a scan over time; ``reverse`` runs from the last step back
    and keeps each output at its own step, as torch's and Keras' backward halves do."""
    batch, units = x.shape[0], recurrent.shape[0]
    projected = jnp.swapaxes(x @ kernel + bias, 0, 1)  # (T, B, 4H)

    def cell(carry, z):
        h, c = carry
        i, f, g, o = jnp.split(z + h @ recurrent, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    zeros = jnp.zeros((batch, units), x.dtype)
    _, hs = jax.lax.scan(cell, (zeros, zeros), projected, reverse=reverse)
    return jnp.swapaxes(hs, 0, 1)


def forward(w: dict, x: jax.Array, layers: int) -> jax.Array:
    """Windows (B, 128, 9) -> logits (B, classes): the layers' forward and backward halves concatenated, the
    last layer's outputs averaged over time, the dense layer."""
    for layer in range(layers):
        x = jnp.concatenate([_direction(x, w[f"lstm{layer}/{d}/kernel"], w[f"lstm{layer}/{d}/recurrent"], w[f"lstm{layer}/{d}/bias"], d == "bw")
                             for d in DIRECTIONS], axis=-1)  # (B, T, 2H)
    return x.mean(axis=1) @ w["dense/kernel"] + w["dense/bias"]


class HarJax(HarTrainer, JaxClassifier):
    """The har trainer in JAX: the BiLSTM with Adam; the jitted step, logits, weights and state are JaxClassifier's."""

    def __init__(self, data: HarData, spec, batch_size: int, runtime):
        super().__init__(data, spec, batch_size)
        layers = self.network.layers
        # optax adds epsilon to sqrt(v) after the bias correction, as torch does: the same step; the rate is a state
        # entry (inject_hyperparams), set before every step as torch's and Keras' are
        self._jit(runtime, self.network.initial_weights(spec.seed), optax.inject_hyperparams(optax.adam)(learning_rate=LEARNING_RATE, eps=EPSILON),
                  lambda w, x: forward(w, x, layers))

    def step(self, batch, flags: list[float], progress: float):
        self.opt_state.hyperparams["learning_rate"] = jax.device_put(jnp.asarray(self.rate_at(progress), jnp.float32), self.replicated)
        return super().step(batch, flags, progress)


def build(data: HarData, spec, batch_size: int, runtime) -> HarJax:
    return HarJax(data, spec, batch_size, runtime)
