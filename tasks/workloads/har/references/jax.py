"""The har BiLSTM in JAX as optax's and flax's documentation teach: an LSTM cell scanned over time with ``lax.scan`` (the backward direction on the reversed sequence, its outputs put back in order, as flax's ``nn.RNN(reverse=True, keep_order=True)``), ``jax.jit`` over the whole training step, optax's Adam.

Flax is not installed here: the cell is written as flax's fused LSTM cell computes it (one product of the step's
input and one of the hidden state for all four gates, inside the scan).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tasks.common.runtimes.references import JaxClassifierReference
from tasks.common.runtimes.references import classifier_arrays as arrays  # noqa: F401 (how the bench reads our side: a classifier's)
from tasks.common.runtimes.references import classifier_loss as ours_loss  # noqa: F401
from tasks.common.runtimes.references import classifier_weights as ours_weights  # noqa: F401
from tasks.workloads.har.workload import EPSILON, LEARNING_RATE, network_of


def lstm_cell(params, carry, x_t):
    """One step: carry (h, c) each (B, H), input (B, in) -> the new carry and h; gates i, f, g, o."""
    h, c = carry
    z = x_t @ params["kernel"] + h @ params["recurrent"] + params["bias"]  # (B, 4H)
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h


def rnn(params, xs, reverse: bool):
    """One direction over (B, T, in) -> (B, T, H)."""
    xs = jnp.swapaxes(xs, 0, 1)  # (T, B, in): scan runs over the leading axis
    if reverse:
        xs = jnp.flip(xs, 0)
    units = params["recurrent"].shape[0]
    zeros = jnp.zeros((xs.shape[1], units), xs.dtype)
    _, hs = jax.lax.scan(lambda carry, x_t: lstm_cell(params, carry, x_t), (zeros, zeros), xs)
    if reverse:
        hs = jnp.flip(hs, 0)
    return jnp.swapaxes(hs, 0, 1)


def model(params, x):
    """Windows (B, T, in) -> logits (B, classes)."""
    for layer in params["lstm"]:
        x = jnp.concatenate([rnn(layer["fw"], x, False), rnn(layer["bw"], x, True)], axis=-1)  # (B, T, 2H)
    return x.mean(axis=1) @ params["dense"]["kernel"] + params["dense"]["bias"]


optimizer = optax.adam(LEARNING_RATE, eps=EPSILON)


class Reference(JaxClassifierReference):
    words = ("JAX + optax: an LSTM cell under lax.scan (backward direction on the flipped sequence, as flax's nn.RNN), "
             "jax.jit over the whole step, optax.adam, numpy batches in a permuted order")

    def __init__(self, spec, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int):
        network = network_of(spec)
        params = {
            "lstm": [{d: {part: jnp.asarray(weights[f"lstm{layer}/{d}/{part}"]) for part in ("kernel", "recurrent", "bias")} for d in ("fw", "bw")}
                     for layer in range(network.layers)],
            "dense": {"kernel": jnp.asarray(weights["dense/kernel"]), "bias": jnp.asarray(weights["dense/bias"])},
        }
        self.start(params, model, optimizer, x, y, batch_size, spec.seed)
