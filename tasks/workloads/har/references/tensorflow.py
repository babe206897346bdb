"""The har BiLSTM in Keras as its guides write it: a Sequential of Bidirectional(LSTM) layers, GlobalAveragePooling1D and Dense, ``compile`` with Adam, ``Model.fit`` on the arrays.

Keras' defaults throughout (``jit_compile="auto"``: off on a CPU-only host, as Keras decides; the LSTM layer's
own implementation, cuDNN's where a GPU offers it); a callback times each epoch from its start to its end.
"""

import numpy as np

from tasks.common.runtimes.references import KerasClassifierReference
from tasks.common.runtimes.references import classifier_arrays as arrays  # noqa: F401 (how the bench reads our side: a classifier's)
from tasks.common.runtimes.references import classifier_loss as ours_loss  # noqa: F401
from tasks.common.runtimes.references import classifier_weights as ours_weights  # noqa: F401
from tasks.workloads.har.workload import EPSILON, LEARNING_RATE, STEPS, network_of


class Reference(KerasClassifierReference):
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
        self.compile_with(keras.optimizers.Adam(LEARNING_RATE, epsilon=EPSILON), x, y, batch_size)
