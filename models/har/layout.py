"""The har BiLSTM's weights in one layout for every framework, and the size each framework's network is built from.

Stacked bidirectional LSTMs (every layer returns its whole sequence), the last layer's (B, T, 2H) outputs
mean-pooled over time, then a dense layer to the class logits (softmax in the loss).
Weights per layer l and direction d (fw, bw), gates in the order i, f, c, o (input, forget, cell candidate,
output; torch's i, f, g, o is the same order):
  lstm{l}/{d}/kernel (in, 4H), lstm{l}/{d}/recurrent (H, 4H), lstm{l}/{d}/bias (4H,)  [one bias, as Keras has]
  dense/kernel (2H, classes), dense/bias (classes,)
"""

from typing import Protocol

DIRECTIONS = ("fw", "bw")


class Size(Protocol):
    """What a network is built from (tasks.workloads.har.workload.Network is one): stacked layers, units per
    layer and direction, input channels per step, classes."""

    layers: int
    units: int
    inputs: int
    classes: int
