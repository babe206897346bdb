"""The har BiLSTM in Keras as its guides write it: a Sequential of Bidirectional(LSTM) layers, GlobalAveragePooling1D and Dense, ``compile`` with Adam, ``Model.fit`` on the arrays.

Keras' defaults throughout (``jit_compile="auto"``: off on a CPU-only host, as Keras decides; the LSTM layer's
own implementation, cuDNN's where a GPU offers it); a callback times each epoch from its start to its end.
"""

import numpy as np

from tasks.common.references import epoch_timer
from tasks.common.references import classifier_arrays as arrays  # noqa: F401 (how the bench reads our side: a classifier's)
from tasks.common.references import classifier_loss as ours_loss  # noqa: F401
from tasks.common.references import classifier_weights as ours_weights  # noqa: F401
from tasks.workloads.har.workload import EPSILON, LEARNING_RATE, STEPS, network_of


class Reference:
    words = ("Keras 3: Sequential of Bidirectional(LSTM(return_sequences=True)), GlobalAveragePooling1D, Dense; "
             "compile(Adam, SparseCategoricalCrossentropy(from_logits)), Model.fit(x, y, batch_size, shuffle=True) on the arrays, Keras' defaults")

    def __init__(self, spec, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int):
        import keras

        network = network_of(spec)
        layers = keras.layers
        self.model = keras.Sequential(
            [keras.Input((STEPS, network.inputs))]
            + [layers.Bidirectional(layers.LSTM(network.units, return_sequences=True)) for _ in range(network.layers)]
            + [layers.GlobalAveragePooling1D(), layers.Dense(network.classes)])
        # Keras' gate order (i, f, c, o) and layouts are the workload's; a Bidirectional layer holds the forward
        # direction's kernel, recurrent kernel and bias, then the backward one's
        self.model.set_weights([weights[f"lstm{layer}/{d}/{part}"] for layer in range(network.layers) for d in ("fw", "bw")
                                for part in ("kernel", "recurrent", "bias")] + [weights["dense/kernel"], weights["dense/bias"]])
        self.model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE, epsilon=EPSILON),
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        self.x, self.y, self.batch_size = x, y, batch_size
        self.timer = epoch_timer()

    def train(self, steps: int) -> float:
        n = steps * self.batch_size
        self.model.fit(self.x[:n], self.y[:n], batch_size=self.batch_size, epochs=1, shuffle=True, verbose=0, callbacks=[self.timer])
        return self.timer.seconds

    def loss(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(self.model.evaluate(x, y, batch_size=len(x), verbose=0))
