"""The har BiLSTM in a plain PyTorch loop: nn.LSTM(bidirectional=True, batch_first=True), the mean over time, nn.Linear, Adam, F.cross_entropy.

The windows are held in memory as one (N, 128, 9) tensor and each epoch's batches are sliced from a
``torch.randperm`` order. nn.LSTM keeps two biases per gate; the workload trains one (Keras' and JAX's
layout), so the second is zero and frozen here too: the same parameters and Adam step.
"""

import numpy as np
import torch
from torch import nn

from tasks.common.runtimes.references import TorchClassifierReference
from tasks.common.runtimes.references import classifier_arrays as arrays  # noqa: F401 (how the bench reads our side: a classifier's)
from tasks.common.runtimes.references import classifier_loss as ours_loss  # noqa: F401
from tasks.common.runtimes.references import classifier_weights as ours_weights  # noqa: F401
from tasks.workloads.har.workload import EPSILON, LEARNING_RATE, network_of


class BiLSTM(nn.Module):
    def __init__(self, inputs: int, units: int, layers: int, classes: int):
        super().__init__()
        self.lstm = nn.LSTM(inputs, units, num_layers=layers, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(2 * units, classes)

    def forward(self, x):
        out, _ = self.lstm(x)  # (B, T, 2H)
        return self.fc(out.mean(dim=1))


class Reference(TorchClassifierReference):
    words = ("PyTorch: nn.LSTM(bidirectional, batch_first) -> mean over time -> nn.Linear, torch.optim.Adam, F.cross_entropy; "
             "batches sliced from tensors in memory in a torch.randperm order")

    def __init__(self, spec, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int):
        network = network_of(spec)
        self.device = torch.device(spec.device)
        self.model = BiLSTM(network.inputs, network.units, network.layers, network.classes)
        with torch.no_grad():
            for layer in range(network.layers):
                for d, suffix in (("fw", ""), ("bw", "_reverse")):
                    getattr(self.model.lstm, f"weight_ih_l{layer}{suffix}").copy_(torch.from_numpy(weights[f"lstm{layer}/{d}/kernel"].T.copy()))
                    getattr(self.model.lstm, f"weight_hh_l{layer}{suffix}").copy_(torch.from_numpy(weights[f"lstm{layer}/{d}/recurrent"].T.copy()))
                    getattr(self.model.lstm, f"bias_ih_l{layer}{suffix}").copy_(torch.from_numpy(weights[f"lstm{layer}/{d}/bias"]))
                    getattr(self.model.lstm, f"bias_hh_l{layer}{suffix}").zero_().requires_grad_(False)
            self.model.fc.weight.copy_(torch.from_numpy(weights["dense/kernel"].T.copy()))
            self.model.fc.bias.copy_(torch.from_numpy(weights["dense/bias"]))
        self.model.to(self.device)
        self.optimizer = torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad], lr=LEARNING_RATE, eps=EPSILON)
        self.x, self.y = torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device)  # (N, 128, 9), (N,)
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(spec.seed)
