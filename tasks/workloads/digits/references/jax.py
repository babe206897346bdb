"""The digits CNN in JAX as optax's documentation teaches: the model a pure function of its parameters, ``jax.jit`` over the whole training step (loss, gradients, optax update), a Python loop over the batches.

Flax is not installed here: the layers are written as flax.linen's are computed (``lax.conv_general_dilated`` in
NHWC/HWIO, ``nn.max_pool`` = ``lax.reduce_window`` with ``lax.max``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tasks.common.runtimes.references import JaxClassifierReference
from tasks.common.runtimes.references import classifier_arrays as arrays  # noqa: F401 (how the bench reads our side: a classifier's)
from tasks.common.runtimes.references import classifier_loss as ours_loss  # noqa: F401
from tasks.common.runtimes.references import classifier_weights as ours_weights  # noqa: F401
from tasks.workloads.digits.workload import LEARNING_RATE, MOMENTUM


def conv(x, kernel, bias):
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")) + bias


def max_pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def model(params, x):
    """Images (B, 28, 28, 1) -> logits (B, 10)."""
    x = max_pool(jax.nn.relu(conv(x, params["conv1/kernel"], params["conv1/bias"])))  # (B, 13, 13, 32)
    x = max_pool(jax.nn.relu(conv(x, params["conv2/kernel"], params["conv2/bias"])))  # (B, 5, 5, 64)
    x = x.reshape(x.shape[0], -1)
    x = jax.nn.relu(x @ params["dense1/kernel"] + params["dense1/bias"])
    return x @ params["dense2/kernel"] + params["dense2/bias"]


optimizer = optax.sgd(LEARNING_RATE, momentum=MOMENTUM)


class Reference(JaxClassifierReference):
    words = ("JAX + optax: a pure model (lax.conv_general_dilated, max-pool by lax.reduce_window as flax's nn.max_pool), "
             "jax.jit over the whole step, optax.sgd(momentum), numpy batches in a permuted order")

    def __init__(self, spec, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int):
        params = {k: jnp.asarray(v) for k, v in weights.items()}
        self.start(params, model, optimizer, x, y, batch_size, spec.seed)
