"""The digits CNN in a plain PyTorch loop, as PyTorch's tutorials write one: nn.Sequential in NCHW, SGD with momentum, F.cross_entropy.

The images are held in memory as one (N, 1, 28, 28) tensor and each epoch's batches are sliced from a
``torch.randperm`` order (a DataLoader over a TensorDataset collates sample by sample, which would make the
reference slower than the loop it stands for).
"""

import numpy as np
import torch
from torch import nn

from tasks.common.runtimes.references import TorchClassifierReference
from tasks.common.runtimes.references import classifier_arrays as arrays  # noqa: F401 (how the bench reads our side: a classifier's)
from tasks.common.runtimes.references import classifier_loss as ours_loss  # noqa: F401
from tasks.common.runtimes.references import classifier_weights as ours_weights  # noqa: F401
from tasks.workloads.digits.workload import CONV2, LEARNING_RATE, MOMENTUM


def _torch_layout(weights: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The workload's weights in nn.Sequential's parameter order and torch's layouts: conv (out, in, kh, kw), dense (out,
    in); dense1's rows re-ordered from the workload's (h, w, c) flattening to nn.Flatten's (c, h, w)."""
    dense1 = weights["dense1/kernel"].reshape(5, 5, CONV2, -1).transpose(2, 0, 1, 3).reshape(5 * 5 * CONV2, -1)
    return [weights["conv1/kernel"].transpose(3, 2, 0, 1), weights["conv1/bias"], weights["conv2/kernel"].transpose(3, 2, 0, 1), weights["conv2/bias"],
            dense1.T, weights["dense1/bias"], weights["dense2/kernel"].T, weights["dense2/bias"]]


class Reference(TorchClassifierReference):
    words = ("PyTorch: nn.Sequential (NCHW), torch.optim.SGD with momentum, F.cross_entropy; batches sliced from tensors in memory "
             "in a torch.randperm order")

    def __init__(self, spec, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int):
        self.device = torch.device(spec.device)
        self.model = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),  # (B, 32, 13, 13)
            nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),  # (B, 64, 5, 5)
            nn.Flatten(), nn.Linear(1600, 128), nn.ReLU(), nn.Linear(128, 10),
        ).to(self.device)
        with torch.no_grad():
            for p, w in zip(self.model.parameters(), _torch_layout(weights)):
                p.copy_(torch.from_numpy(np.ascontiguousarray(w)))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
        self.x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().to(self.device)  # (N, 1, 28, 28)
        self.y = torch.from_numpy(y).to(self.device)
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(spec.seed)

    def inputs(self, x: np.ndarray):
        return torch.from_numpy(x).permute(0, 3, 1, 2).to(self.device)  # (B, 28, 28, 1) -> (B, 1, 28, 28)
