"""The har network in JAX: the stacked bidirectional LSTM of layout.py as a pure function of its weights."""

import jax
import jax.numpy as jnp

from models.har.layout import DIRECTIONS


def _layer(x: jax.Array, w: dict, layer: int) -> jax.Array:
    """One bidirectional layer over windows (B, T, in) -> (B, T, 2H), forward outputs then backward ones at each step.

    Both directions run in one scan over time, stacked on a leading axis of 2: the backward one reads the windows
    flipped in time and its outputs are flipped back, so each stays at its own step, as torch's and Keras' backward
    halves do. A step's gates (i, f, c, o, layout.py's order) are one product of its input and hidden state with
    the direction's kernel and recurrent kernel stacked. The cell is rematerialised (``jax.checkpoint``): the
    backward pass keeps only each step's carry and recomputes the gates, where saving them would write a dozen
    (T, B, H) buffers a step, which costs more on a CPU than computing them again (docs/frameworks.md)."""
    weights = jnp.stack([jnp.concatenate([w[f"lstm{layer}/{d}/kernel"], w[f"lstm{layer}/{d}/recurrent"]]) for d in DIRECTIONS])  # (2, in + H, 4H)
    bias = jnp.stack([w[f"lstm{layer}/{d}/bias"] for d in DIRECTIONS])[:, None]  # (2, 1, 4H)
    batch, units = x.shape[0], weights.shape[-1] // 4
    inputs = jnp.swapaxes(x, 0, 1)  # (T, B, in): scan runs over the leading axis
    inputs = jnp.stack([inputs, jnp.flip(inputs, 0)], axis=1)  # (T, 2, B, in)

    @jax.checkpoint
    def cell(carry, x_t):
        """One step of both directions: carry (h, c), each (2, B, H), and input (2, B, in) -> the new carry and h."""
        h, c = carry
        z = jnp.einsum("dbi,dig->dbg", jnp.concatenate([x_t, h], axis=-1), weights) + bias  # (2, B, 4H)
        i, f, g, o = jnp.split(z, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    zeros = jnp.zeros((len(DIRECTIONS), batch, units), x.dtype)
    _, hs = jax.lax.scan(cell, (zeros, zeros), inputs)  # (T, 2, B, H)
    return jnp.swapaxes(jnp.concatenate([hs[:, 0], jnp.flip(hs[:, 1], 0)], axis=-1), 0, 1)


def forward(w: dict, x: jax.Array, layers: int) -> jax.Array:
    """Windows (B, 128, 9) -> logits (B, classes): each layer's forward and backward halves concatenated, the
    last layer's outputs averaged over time, the dense layer."""
    for layer in range(layers):
        x = _layer(x, w, layer)  # (B, T, 2H)
    return x.mean(axis=1) @ w["dense/kernel"] + w["dense/bias"]
