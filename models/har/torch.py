"""The har network in PyTorch: the stacked bidirectional LSTM of layout.py, its weights in and out of that layout."""

import numpy as np
import torch
from torch import nn

from models.har.layout import DIRECTIONS, Size


class HarBiLSTM(nn.Module):
    """Windows (B, 128, 9) -> logits (B, classes): nn.LSTM(bidirectional=True) over the layers, the last
    layer's outputs mean-pooled over time, a dense layer.

    torch's LSTM keeps two biases per direction (input and recurrent) where Keras keeps one: the
    layout's bias goes into ``bias_ih`` and ``bias_hh`` stays zero and frozen, so the two frameworks
    train the same parameters (and Adam sees one bias, not two that move together)."""

    def __init__(self, network: Size):
        super().__init__()
        self.network = network
        self.lstm = nn.LSTM(network.inputs, network.units, num_layers=network.layers, bidirectional=True, batch_first=True)
        self.dense = nn.Linear(2 * network.units, network.classes)
        for name, p in self.lstm.named_parameters():
            if name.startswith("bias_hh"):
                nn.init.zeros_(p)
                p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)  # (B, T, 2H): forward then backward features at each step
        return self.dense(out.mean(dim=1))  # (B, classes)

    def _pairs(self):
        """(layout name, torch parameter, transpose?) of every trained weight."""
        for layer in range(self.network.layers):
            for d, suffix in zip(DIRECTIONS, ("", "_reverse")):
                yield f"lstm{layer}/{d}/kernel", getattr(self.lstm, f"weight_ih_l{layer}{suffix}"), True  # torch (4H, in)
                yield f"lstm{layer}/{d}/recurrent", getattr(self.lstm, f"weight_hh_l{layer}{suffix}"), True  # torch (4H, H)
                yield f"lstm{layer}/{d}/bias", getattr(self.lstm, f"bias_ih_l{layer}{suffix}"), False
        yield "dense/kernel", self.dense.weight, True  # torch (classes, 2H)
        yield "dense/bias", self.dense.bias, False

    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Weights in layout.py's layout into torch's (gates i, f, g, o: the same order, transposed)."""
        with torch.no_grad():
            for name, p, transpose in self._pairs():
                p.copy_(torch.from_numpy(np.ascontiguousarray(weights[name].T if transpose else weights[name])))

    def weights(self) -> dict[str, np.ndarray]:
        out = {}
        for name, p, transpose in self._pairs():
            w = p.detach().cpu().numpy()
            out[name] = np.ascontiguousarray(w.T if transpose else w)
        return out
