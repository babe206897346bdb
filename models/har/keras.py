"""The har network in Keras 3: the stacked bidirectional LSTM of layout.py, and its variables under the layout's weight names."""

from models.har.layout import DIRECTIONS, Size


def build_bilstm(network: Size, steps: int):
    """Windows (B, steps, inputs) -> logits (B, classes): Bidirectional(LSTM) layers returning their sequences
    (the backward half re-aligned in time, concatenated after the forward half, as torch's), the mean over time, a dense layer."""
    import keras

    layers = keras.layers
    stack = [keras.Input((steps, network.inputs))]
    for layer in range(network.layers):
        stack.append(layers.Bidirectional(layers.LSTM(network.units, return_sequences=True), merge_mode="concat", name=f"lstm{layer}"))  # (B, T, 2H)
    stack += [layers.GlobalAveragePooling1D(), layers.Dense(network.classes, name="dense")]  # (B, 2H) -> (B, classes)
    return keras.Sequential(stack)


def variables_of(net, network: Size) -> dict:
    """Keras' variables under layout.py's weight names (Keras' gate order i, f, c, o and layouts are the layout's)."""
    out = {}
    for layer in range(network.layers):
        bidirectional = net.get_layer(f"lstm{layer}")
        for d, half in zip(DIRECTIONS, (bidirectional.forward_layer, bidirectional.backward_layer)):
            cell = half.cell
            out |= {f"lstm{layer}/{d}/kernel": cell.kernel, f"lstm{layer}/{d}/recurrent": cell.recurrent_kernel, f"lstm{layer}/{d}/bias": cell.bias}
    dense = net.get_layer("dense")
    return out | {"dense/kernel": dense.kernel, "dense/bias": dense.bias}
