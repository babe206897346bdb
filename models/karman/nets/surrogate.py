"""The trained generator as one self-contained model: physical state in, physical next state out.

The normalisation (centre and scale of u, v, p; the mask's {0, 1} -> {-1, 1}; a conditioned model's
Reynolds centre and scale) and, for models that
predict the change of state, its per-channel scale travel with the weights as buffers, so whoever
loads the model (``mlflow.pytorch.load_model``) steps a flow without this project's data code.
"""

import torch
import torch.nn.functional as F
from torch import nn

from models.karman.damping import passes


def damp(x: torch.Tensor, strength: float) -> torch.Tensor:
    """x (B, C, H, W) with its highest wavenumbers damped by ``strength``: models.karman.damping.damp in torch."""
    if strength == 0:
        return x
    c = x.shape[1]
    kernel = torch.full((3,), 0.25, dtype=x.dtype, device=x.device)  # made on the device: no copy from the host (a CUDA graph records none)
    kernel[1] = 0.5
    rows = kernel.view(1, 1, 3, 1).expand(c, 1, 3, 1)  # depthwise, along H
    cols = kernel.view(1, 1, 1, 3).expand(c, 1, 1, 3)  # depthwise, along W
    for weight in passes(strength):
        blurred = F.conv2d(F.pad(x, (0, 0, 1, 1), mode="replicate"), rows, groups=c)
        blurred = F.conv2d(F.pad(blurred, (1, 1, 0, 0), mode="replicate"), cols, groups=c)
        x = x - weight * (x - blurred)
    return x


class Surrogate(nn.Module):
    """``forward(state)``: state (B, 4, H, W) = u, v, p and the obstacle mask (1 inside) at time t, in
    lattice units, and for a model conditioned on the Reynolds number (``reynolds``: its centre and
    scale) a fifth channel holding it everywhere -> (B, 3, H, W) = u, v, p at t + k. H and W must suit
    the U-Net (multiples of 2^depth). ``damping``: the recipe's damping of the predicted change's
    highest wavenumbers (models.karman.damping)."""

    def __init__(self, generator: nn.Module, center: list[float], scale: list[float], delta_scale: list[float] | None,
                 reynolds: list[float] | None = None, damping: float = 0.0):
        super().__init__()
        self.generator = generator
        self.damping = float(damping)
        self.conditioned = reynolds is not None
        self.register_buffer("reynolds", torch.tensor(reynolds or [0.0, 1.0], dtype=torch.float32))
        self.register_buffer("center", torch.tensor(center, dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32).view(1, 3, 1, 1))
        self.predicts_change = delta_scale is not None
        self.register_buffer("delta_scale", torch.tensor(delta_scale or [1.0, 1.0, 1.0], dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        fields, mask = state[:, :3], state[:, 3:4]
        parts = [(fields - self.center) / self.scale, 2 * mask - 1]
        if self.conditioned:
            parts.append((state[:, 4:5] - self.reynolds[0]) / self.reynolds[1])
        encoded = torch.cat(parts, dim=1)
        out = self.generator(encoded).float()
        if self.predicts_change:
            # a model pickled before damping existed has no such attribute
            return fields + damp(out, getattr(self, "damping", 0.0)) * self.delta_scale
        return out * self.scale + self.center
