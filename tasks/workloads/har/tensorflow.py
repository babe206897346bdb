"""The har workload in TensorFlow (Keras 3 under the run's tf.distribute strategy: default, mirrored or multiworker): models.har.keras's BiLSTM from the workload's numpy initial weights, one Adam step per batch, logits for scoring."""

from models.har.keras import build_bilstm, variables_of
from tasks.common.runtimes.classifier_keras import KerasClassifier
from tasks.workloads.har.workload import EPSILON, LEARNING_RATE, STEPS, HarData, HarTrainer


class HarKeras(HarTrainer, KerasClassifier):
    """The har trainer in Keras: the BiLSTM with Adam; the step, logits, weights and state (through ``_variables``) are KerasClassifier's."""

    def __init__(self, data: HarData, spec, batch_size: int, runtime):
        import keras

        super().__init__(data, spec, batch_size, runtime.ctx.rank, runtime.ctx.workers)  # this worker's share of each batch
        self.runtime = runtime
        with runtime.ctx.strategy.scope():
            self.net = build_bilstm(self.network, STEPS)
            self.opt = keras.optimizers.Adam(LEARNING_RATE, epsilon=EPSILON)
            self.opt.build(self.net.trainable_variables)
        self._variables = variables_of(self.net, self.network)
        self.load_weights(self.network.initial_weights(spec.seed))
        self._compile(spec)

    def step(self, batch, flags: list[float], progress: float):
        self.opt.learning_rate = self.rate_at(progress)  # the optimiser's rate variable, assigned outside the traced step
        return super().step(batch, flags, progress)


def build(data: HarData, spec, batch_size: int, runtime) -> HarKeras:
    return HarKeras(data, spec, batch_size, runtime)
