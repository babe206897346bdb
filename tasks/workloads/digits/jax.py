"""The digits workload in JAX (jit; data-parallel over the runtime's devices): the CNN of workload.py as a pure function of its weights, optax SGD with momentum, logits for scoring."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tasks.workloads.digits.workload import LEARNING_RATE, MOMENTUM, DigitsData, DigitsTrainer, initial_weights

DIMENSIONS = ("NHWC", "HWIO", "NHWC")  # images, kernels (workload.py's layout), features


def _conv(x, kernel, bias):
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID", dimension_numbers=DIMENSIONS) + bias


def _pool(x):
    """2x2 max-pool, stride 2, an odd last row and column dropped (as torch's and Keras' pools do). A
    reshape and a max rather than lax.reduce_window: XLA's CPU backend takes the latter's gradient
    (select-and-scatter) slowly, and the whole step ran 2.7x slower with it (47 against 17 ms at batch 64)."""
    b, h, w, c = x.shape
    x = x[:, : h // 2 * 2, : w // 2 * 2]
    return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def forward(w: dict, x: jax.Array) -> jax.Array:
    """Images (B, 28, 28, 1) -> logits (B, 10)."""
    x = _pool(jax.nn.relu(_conv(x, w["conv1/kernel"], w["conv1/bias"])))  # (B, 13, 13, 32)
    x = _pool(jax.nn.relu(_conv(x, w["conv2/kernel"], w["conv2/bias"])))  # (B, 5, 5, 64)
    x = x.reshape(x.shape[0], -1)  # (B, 1600) in (h, w, c) order
    x = jax.nn.relu(x @ w["dense1/kernel"] + w["dense1/bias"])
    return x @ w["dense2/kernel"] + w["dense2/bias"]


class DigitsJax(DigitsTrainer):
    framework = "jax"

    def __init__(self, data: DigitsData, spec, batch_size: int, runtime):
        super().__init__(data, spec, batch_size)
        self._jit(runtime, initial_weights(spec.seed), optax.sgd(LEARNING_RATE, momentum=MOMENTUM), forward)

    def _jit(self, runtime, weights: dict[str, np.ndarray], opt, logits_of) -> None:
        """The weights on the runtime's device, the optimiser's state, and the jitted training step (mean
        cross-entropy of ``logits_of(w, x)``, one ``opt`` update) and logits; shared with the other workloads' JAX trainers."""
        self.runtime = runtime
        # the weights and the optimiser's state on every device, each batch split over them (one device: plain placement)
        self.replicated, self.split = runtime.ctx.shardings()
        self.w = jax.device_put({k: jnp.asarray(v) for k, v in weights.items()}, self.replicated)
        self.opt = opt
        self.opt_state = jax.device_put(opt.init(self.w), self.replicated)
        self.speed = {"threads": runtime.threads, "jit": True}

        def loss(w, x, y):
            return optax.softmax_cross_entropy_with_integer_labels(logits_of(w, x), y).mean()

        def step(w, opt_state, x, y):
            value, grads = jax.value_and_grad(loss)(w, x, y)
            updates, opt_state = opt.update(grads, opt_state, w)
            return optax.apply_updates(w, updates), opt_state, value

        self._step = jax.jit(step, donate_argnums=(0, 1))
        self._logits = jax.jit(logits_of)

    def _device(self, x: np.ndarray, y: np.ndarray):
        return jax.device_put(x, self.split), jax.device_put(y.astype(np.int32), self.split)  # (b, ...), (b,): b/devices on each

    def step(self, batch, flags: list[float], progress: float):
        self.w, self.opt_state, loss = self._step(self.w, self.opt_state, *batch)
        return {"loss_ce": float(loss)}, self.runtime.agree(flags)  # reading the loss waits for the step

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._logits(self.w, jax.device_put(x, self.replicated)))  # any count of samples

    def weights(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in self.w.items()}

    def state(self) -> dict:
        leaves = jax.tree_util.tree_leaves((self.w, self.opt_state))
        return {f"{i:04d}": np.asarray(v) for i, v in enumerate(leaves)}

    def load_state(self, state: dict) -> None:
        treedef = jax.tree_util.tree_structure((self.w, self.opt_state))
        leaves = [jnp.asarray(state[k]) for k in sorted(state)]
        self.w, self.opt_state = jax.device_put(jax.tree_util.tree_unflatten(treedef, leaves), self.replicated)


def build(data: DigitsData, spec, batch_size: int, runtime) -> DigitsJax:
    return DigitsJax(data, spec, batch_size, runtime)
