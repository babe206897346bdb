"""The har workload in JAX (jit; data-parallel over the runtime's devices): models.har.jax's BiLSTM as a pure function of its weights, optax Adam, logits for scoring."""

import jax
import jax.numpy as jnp
import optax

from models.har.jax import forward
from tasks.common.runtimes.classifier_jax import JaxClassifier
from tasks.workloads.har.workload import EPSILON, LEARNING_RATE, HarData, HarTrainer


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
