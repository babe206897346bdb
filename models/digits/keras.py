"""The digits network in Keras 3: the MNIST CNN, NHWC, its layers named after the shared weight layout's (conv1, conv2, dense1, dense2)."""


def build_cnn():
    """Images (B, 28, 28, 1) -> logits (B, 10), NHWC: Flatten gives the (h, w, c) order of the layout's dense1."""
    import keras

    layers = keras.layers
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(32, 3, activation="relu", name="conv1"), layers.MaxPooling2D(2),  # (B, 13, 13, 32)
        layers.Conv2D(64, 3, activation="relu", name="conv2"), layers.MaxPooling2D(2),  # (B, 5, 5, 64)
        layers.Flatten(),  # (B, 1600)
        layers.Dense(128, activation="relu", name="dense1"), layers.Dense(10, name="dense2"),
    ])
