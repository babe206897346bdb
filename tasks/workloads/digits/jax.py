"""The digits workload in JAX (jit; data-parallel over the runtime's devices): models.digits.jax's CNN as a pure function of its weights, optax SGD with momentum, logits for scoring."""

import optax

from models.digits.jax import forward
from tasks.common.runtimes.classifier_jax import JaxClassifier
from tasks.workloads.digits.workload import LEARNING_RATE, MOMENTUM, DigitsData, DigitsTrainer, initial_weights


class DigitsJax(DigitsTrainer, JaxClassifier):
    def __init__(self, data: DigitsData, spec, batch_size: int, runtime):
        super().__init__(data, spec, batch_size)
        self._jit(runtime, initial_weights(spec.seed), optax.sgd(LEARNING_RATE, momentum=MOMENTUM), forward)


def build(data: DigitsData, spec, batch_size: int, runtime) -> DigitsJax:
    return DigitsJax(data, spec, batch_size, runtime)
