"""The digits workload in TensorFlow (Keras 3 under the run's tf.distribute strategy): the CNN of workload.py from its numpy initial weights, one SGD-momentum step per batch, logits for scoring."""

import numpy as np

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


class DigitsKeras(DigitsTrainer):
    framework = "tensorflow"

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
        self.speed = {"threads": runtime.threads, "jit_compile": spec.compile == "on"}
        self._compile(spec)

    def _compile(self, spec) -> None:
        """The traced step (mean sparse softmax cross-entropy of ``self.net``'s logits, one ``self.opt`` step) on
        every replica of the strategy, and logits. Each replica's gradient is of its share's mean over the
        replicas: the optimiser sums the replicas' gradients, which makes the global batch's mean."""
        import keras
        import tensorflow as tf

        strategy = self.runtime.ctx.strategy
        replicas = strategy.num_replicas_in_sync

        def replica_step(x, y):  # this replica's share: (b, ...) inputs, (b,) labels
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, self.net(x, training=True), from_logits=True))
            grads = [g / replicas for g in tape.gradient(loss, self.net.trainable_variables)]
            self.opt.apply_gradients(zip(grads, self.net.trainable_variables))
            return loss

        def step(x, y):
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(replica_step, args=(x, y)), axis=None)

        self._step = tf.function(step, jit_compile=spec.compile == "on")
        self._logits = tf.function(lambda x: self.net(x, training=False), reduce_retracing=True)

    def _device(self, x: np.ndarray, y: np.ndarray):
        return self.runtime.distribute((x, y))  # this worker's share, split over its replicas

    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        for name, variable in self._variables.items():
            variable.assign(weights[name])

    def step(self, batch, flags: list[float], progress: float):
        loss = float(self._step(*batch))  # reading the loss waits for the step
        return {"loss_ce": loss}, self.runtime.agree(flags)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self._logits(x).numpy()

    def weights(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(v.numpy()) for name, v in self._variables.items()}

    def state(self) -> dict:
        return {f"{i:04d}": np.asarray(v.numpy()) for i, v in enumerate(self.net.weights + self.opt.variables)}

    def load_state(self, state: dict) -> None:
        for key, v in zip(sorted(state), self.net.weights + self.opt.variables):
            v.assign(state[key])


def build(data: DigitsData, spec, batch_size: int, runtime) -> DigitsKeras:
    return DigitsKeras(data, spec, batch_size, runtime)
