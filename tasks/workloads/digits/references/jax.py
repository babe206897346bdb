"""The digits CNN in JAX as optax's documentation teaches: the model a pure function of its parameters, ``jax.jit`` over the whole training step (loss, gradients, optax update), a Python loop over the batches.

Flax is not installed here: the layers are written as flax.linen's are computed (``lax.conv_general_dilated`` in
NHWC/HWIO, ``nn.max_pool`` = ``lax.reduce_window`` with ``lax.max``).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tasks.common.references import classifier_arrays as arrays  # noqa: F401 (how the bench reads our side: a classifier's)
from tasks.common.references import classifier_loss as ours_loss  # noqa: F401
from tasks.common.references import classifier_weights as ours_weights  # noqa: F401
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


def loss_fn(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(params, x), y).mean()


optimizer = optax.sgd(LEARNING_RATE, momentum=MOMENTUM)


@jax.jit
def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


class Reference:
    words = ("JAX + optax: a pure model (lax.conv_general_dilated, max-pool by lax.reduce_window as flax's nn.max_pool), "
             "jax.jit over the whole step, optax.sgd(momentum), numpy batches in a permuted order")

    def __init__(self, spec, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int):
        self.params = {k: jnp.asarray(v) for k, v in weights.items()}
        self.opt_state = optimizer.init(self.params)
        self.x, self.y, self.batch_size = x, y.astype(np.int32), batch_size
        self.rng = np.random.default_rng(spec.seed)

    def train(self, steps: int) -> float:
        t0 = time.perf_counter()
        order = self.rng.permutation(len(self.y))
        for i in range(steps):
            take = order[i * self.batch_size: (i + 1) * self.batch_size]
            self.params, self.opt_state, loss = train_step(self.params, self.opt_state, self.x[take], self.y[take])
        jax.block_until_ready(self.params)
        return time.perf_counter() - t0

    def loss(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(jax.jit(loss_fn)(self.params, x, y.astype(np.int32)))
