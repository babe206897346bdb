"""The har workload in TensorFlow (Keras 3, one device): the stacked bidirectional LSTM of workload.py from its numpy initial weights, one Adam step per batch, logits for scoring."""

import numpy as np

from tasks.workloads.har.workload import DIRECTIONS, EPSILON, LEARNING_RATE, STEPS, HarData, HarTrainer, Network


def build_bilstm(network: Network):
    """Windows (B, 128, 9) -> logits (B, classes): Bidirectional(LSTM) layers returning their sequences
    (the backward half re-aligned in time, concatenated after the forward half, as torch's), the mean over time, a dense layer."""
    import keras

    layers = keras.layers
    stack = [keras.Input((STEPS, network.inputs))]
    for layer in range(network.layers):
        stack.append(layers.Bidirectional(layers.LSTM(network.units, return_sequences=True), merge_mode="concat", name=f"lstm{layer}"))  # (B, T, 2H)
    stack += [layers.GlobalAveragePooling1D(), layers.Dense(network.classes, name="dense")]  # (B, 2H) -> (B, classes)
    return keras.Sequential(stack)


def variables_of(net, network: Network) -> dict:
    """Keras' variables under workload.py's weight names (Keras' gate order i, f, c, o and layouts are the workload's)."""
    out = {}
    for layer in range(network.layers):
        bidirectional = net.get_layer(f"lstm{layer}")
        for d, half in zip(DIRECTIONS, (bidirectional.forward_layer, bidirectional.backward_layer)):
            cell = half.cell
            out |= {f"lstm{layer}/{d}/kernel": cell.kernel, f"lstm{layer}/{d}/recurrent": cell.recurrent_kernel, f"lstm{layer}/{d}/bias": cell.bias}
    dense = net.get_layer("dense")
    return out | {"dense/kernel": dense.kernel, "dense/bias": dense.bias}


class HarKeras(HarTrainer):
    framework = "tensorflow"

    def __init__(self, data: HarData, spec, batch_size: int, runtime):
        import keras
        import tensorflow as tf

        super().__init__(data, spec, batch_size)
        self.runtime = runtime
        with runtime.ctx.strategy.scope():
            self.net = build_bilstm(self.network)
            self.opt = keras.optimizers.Adam(LEARNING_RATE, epsilon=EPSILON)
            self.opt.build(self.net.trainable_variables)
        self._variables = variables_of(self.net, self.network)
        self.load_weights(self.network.initial_weights(spec.seed))
        self.speed = {"threads": runtime.threads, "jit_compile": spec.compile == "on"}

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, self.net(x, training=True), from_logits=True))
            self.opt.apply_gradients(zip(tape.gradient(loss, self.net.trainable_variables), self.net.trainable_variables))
            return loss

        self._step = tf.function(step, jit_compile=spec.compile == "on")
        self._logits = tf.function(lambda x: self.net(x, training=False), reduce_retracing=True)

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


def build(data: HarData, spec, batch_size: int, runtime) -> HarKeras:
    return HarKeras(data, spec, batch_size, runtime)
