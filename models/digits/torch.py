"""The digits network in PyTorch: the MNIST CNN, its weights in and out of the one layout every framework shares (conv (kh, kw, in, out), dense (in, out))."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class DigitsCNN(nn.Module):
    """Images (B, 28, 28, 1) -> logits (B, 10); the features are flattened in (h, w, c) order as in the other frameworks."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
        self.dense1, self.dense2 = nn.Linear(1600, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 3, 1, 2)  # (B, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # (B, 32, 13, 13)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # (B, 64, 5, 5)
        x = x.permute(0, 2, 3, 1).flatten(1)  # (B, 1600) in (h, w, c) order
        return self.dense2(F.relu(self.dense1(x)))

    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Weights in the shared layout (conv (kh, kw, in, out), dense (in, out)) into torch's."""
        with torch.no_grad():
            for name in ("conv1", "conv2", "dense1", "dense2"):
                kernel = weights[f"{name}/kernel"]
                layer = getattr(self, name)
                layer.weight.copy_(torch.from_numpy(kernel.transpose(3, 2, 0, 1) if kernel.ndim == 4 else kernel.T.copy()))
                layer.bias.copy_(torch.from_numpy(weights[f"{name}/bias"]))

    def weights(self) -> dict[str, np.ndarray]:
        out = {}
        for name in ("conv1", "conv2", "dense1", "dense2"):
            w = getattr(self, name).weight.detach().cpu().numpy()
            out[f"{name}/kernel"] = np.ascontiguousarray(w.transpose(2, 3, 1, 0) if w.ndim == 4 else w.T)
            out[f"{name}/bias"] = getattr(self, name).bias.detach().cpu().numpy()
        return out
