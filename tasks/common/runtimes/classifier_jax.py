"""A classifier's trainer in JAX, for any workload's network as a pure function of its weights.

On classifier.py: the jitted step (mean cross-entropy, one optax update; data-parallel over the runtime's devices),
logits, the weights and the checkpoint state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tasks.common.runtimes.classifier import Classifier


class JaxClassifier(Classifier):
    """The workload's trainer calls ``_jit`` with its initial weights, optimiser and ``logits_of(w, x)``."""

    framework = "jax"

    def _jit(self, runtime, weights: dict[str, np.ndarray], opt, logits_of) -> None:
        """The weights on the runtime's device, the optimiser's state, and the jitted training step (mean
        cross-entropy of ``logits_of(w, x)``, one ``opt`` update) and logits."""
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
