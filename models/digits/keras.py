"""The digits workload in TensorFlow (Keras 3 under the run's tf.distribute strategy): the CNN of workload.py from its numpy initial weights, one SGD-momentum step per batch, logits for scoring."""


from tasks.common.training.classifier_keras import KerasClassifier
from tasks.workloads.digits.workload import LEARNING_RATE, MOMENTUM, WEIGHT_SHAPES, DigitsData, DigitsTrainer, initial_weights


def build_cnn():
    """Images (B, 28, 28, 1) -> logits (B, 10), NHWC: Flatten gives the (h, w, c) order of workload.py's dense1."""
    import keras

    layers = keras.layers
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(32, 3, activation="relu", name="conv1"), layers.MaxPooling2D(2),  # (B, 13, 13, 32)
        layers.Conv2D(64, 3, activation="relu", name="conv2"), layers.MaxPooling2D(2),  # (B, 5, 5, 64)
        layers.Flatten(),  # (B, 1600)
        layers.Dense(128, activation="relu", name="dense1"), layers.Dense(10, name="dense2"),
    ])


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
