"""The har workload in TensorFlow (Keras 3 under the run's tf.distribute strategy: default, mirrored or multiworker): the stacked bidirectional LSTM of workload.py from its numpy initial weights, one Adam step per batch, logits for scoring."""

from tasks.common.training.classifier_keras import KerasClassifier
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


class HarKeras(HarTrainer, KerasClassifier):
    """The har trainer in Keras: the BiLSTM with Adam; the step, logits, weights and state (through ``_variables``) are KerasClassifier's."""

    def __init__(self, data: HarData, spec, batch_size: int, runtime):
        import keras

        super().__init__(data, spec, batch_size, runtime.ctx.rank, runtime.ctx.workers)  # this worker's share of each batch
        self.runtime = runtime
        with runtime.ctx.strategy.scope():
            self.net = build_bilstm(self.network)
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
