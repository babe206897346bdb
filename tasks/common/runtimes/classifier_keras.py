"""A classifier's trainer in Keras under a tf.distribute strategy, for any workload's network.

On classifier.py: the traced step (mean sparse softmax cross-entropy, one optimiser step on every replica), logits,
the weights and the checkpoint state."""

import numpy as np

from tasks.common.runtimes.classifier import Classifier


class KerasClassifier(Classifier):
    """The workload's trainer sets ``net``, ``opt`` and ``_variables`` (weight name -> variable, the workload's layout) in the
    strategy's scope, then calls ``_compile``."""

    framework = "tensorflow"

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

        self._step = tf.function(step, jit_compile=spec.compile == "on", autograph=False)
        self._logits = tf.function(lambda x: self.net(x, training=False), reduce_retracing=True, autograph=False)
        self.speed = {"threads": self.runtime.threads, "jit_compile": spec.compile == "on"}

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
