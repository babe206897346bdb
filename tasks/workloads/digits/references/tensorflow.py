"""The digits CNN in Keras as its guides write it: a Sequential of built-in layers, ``compile`` with SGD and sparse categorical cross-entropy, ``Model.fit`` on the arrays.

Keras' defaults throughout (``jit_compile="auto"``: off on a CPU-only host, as Keras decides; one step per
execution); a callback times each epoch from its start to its end, as a multi-epoch ``fit`` runs it.
"""

import numpy as np

from tasks.common.runtimes.references import KerasClassifierReference
from tasks.common.runtimes.references import classifier_arrays as arrays  # noqa: F401 (how the bench reads our side: a classifier's)
from tasks.common.runtimes.references import classifier_loss as ours_loss  # noqa: F401
from tasks.common.runtimes.references import classifier_weights as ours_weights  # noqa: F401
from tasks.workloads.digits.workload import LEARNING_RATE, MOMENTUM


class Reference(KerasClassifierReference):
    words = ("Keras 3: Sequential of Conv2D/MaxPooling2D/Flatten/Dense, compile(SGD(momentum), SparseCategoricalCrossentropy(from_logits)), "
             "Model.fit(x, y, batch_size, shuffle=True) on the arrays, Keras' defaults")

    def __init__(self, spec, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int):
        import keras

        layers = keras.layers
        self.model = keras.Sequential([
            keras.Input((28, 28, 1)),
            layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(),
            layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dense(10),
        ])
        # Keras' layouts are the workload's (kernels HWIO and (in, out), NHWC flattening)
        self.model.set_weights([weights[f"{name}/{part}"] for name in ("conv1", "conv2", "dense1", "dense2") for part in ("kernel", "bias")])
        self.compile_with(keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM), x, y, batch_size)
