"""The digits workload in TensorFlow (Keras 3 under the run's tf.distribute strategy): models.digits.keras's CNN from the workload's numpy initial weights, one SGD-momentum step per batch, logits for scoring."""

from models.digits.keras import build_cnn
from tasks.common.runtimes.classifier_keras import KerasClassifier
from tasks.workloads.digits.workload import LEARNING_RATE, MOMENTUM, WEIGHT_SHAPES, DigitsData, DigitsTrainer, initial_weights


class DigitsKeras(DigitsTrainer, KerasClassifier):
    def __init__(self, data: DigitsData, spec, batch_size: int, runtime):
        import keras

        super().__init__(data, spec, batch_size, runtime.ctx.rank, runtime.ctx.workers)
        self.runtime = runtime
        with runtime.ctx.strategy.scope():
            self.net = build_cnn()
            self.opt = keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
            self.opt.build(self.net.trainable_variables)
        self._variables = {name: self.net.get_layer(name.split("/")[0]).weights[0 if name.endswith("kernel") else 1] for name in WEIGHT_SHAPES}
        self.load_weights(initial_weights(spec.seed))
        self._compile(spec)


def build(data: DigitsData, spec, batch_size: int, runtime) -> DigitsKeras:
    return DigitsKeras(data, spec, batch_size, runtime)
