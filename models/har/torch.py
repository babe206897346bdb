"""The har workload in PyTorch: the stacked bidirectional LSTM of workload.py from its numpy initial weights, one Adam step per batch, logits for scoring."""

import numpy as np
import torch
from torch import nn

from tasks.common.training.classifier_torch import TorchClassifier
from tasks.workloads.har.workload import DIRECTIONS, EPSILON, LEARNING_RATE, HarData, HarTrainer, Network


class HarBiLSTM(nn.Module):
    """Windows (B, 128, 9) -> logits (B, classes): nn.LSTM(bidirectional=True) over the layers, the last
    layer's outputs mean-pooled over time, a dense layer.

    torch's LSTM keeps two biases per direction (input and recurrent) where Keras keeps one: the
    workload's bias goes into ``bias_ih`` and ``bias_hh`` stays zero and frozen, so the two frameworks
    train the same parameters (and Adam sees one bias, not two that move together)."""

    def __init__(self, network: Network):
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
        """(workload name, torch parameter, transpose?) of every trained weight."""
        for layer in range(self.network.layers):
            for d, suffix in zip(DIRECTIONS, ("", "_reverse")):
                yield f"lstm{layer}/{d}/kernel", getattr(self.lstm, f"weight_ih_l{layer}{suffix}"), True  # torch (4H, in)
                yield f"lstm{layer}/{d}/recurrent", getattr(self.lstm, f"weight_hh_l{layer}{suffix}"), True  # torch (4H, H)
                yield f"lstm{layer}/{d}/bias", getattr(self.lstm, f"bias_ih_l{layer}{suffix}"), False
        yield "dense/kernel", self.dense.weight, True  # torch (classes, 2H)
        yield "dense/bias", self.dense.bias, False

    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Weights in workload.py's layout into torch's (gates i, f, g, o: the same order, transposed)."""
        with torch.no_grad():
            for name, p, transpose in self._pairs():
                p.copy_(torch.from_numpy(np.ascontiguousarray(weights[name].T if transpose else weights[name])))

    def weights(self) -> dict[str, np.ndarray]:
        out = {}
        for name, p, transpose in self._pairs():
            w = p.detach().cpu().numpy()
            out[name] = np.ascontiguousarray(w.T if transpose else w)
        return out


class HarTorch(HarTrainer, TorchClassifier):
    """The har trainer in torch: the BiLSTM with Adam; the step, logits, weights and state are TorchClassifier's."""

    def __init__(self, data: HarData, spec, batch_size: int, runtime):
        super().__init__(data, spec, batch_size, *self.share(runtime))  # this rank's share of each batch
        net = HarBiLSTM(self.network)
        net.load_weights(self.network.initial_weights(spec.seed))  # the same on every rank and in every framework
        self._place(runtime, net)
        self.opt = torch.optim.Adam([p for p in self.net.parameters() if p.requires_grad], lr=LEARNING_RATE, eps=EPSILON)

    def step(self, batch, flags: list[float], progress: float):
        for group in self.opt.param_groups:
            group["lr"] = self.rate_at(progress)
        return super().step(batch, flags, progress)


def build(data: HarData, spec, batch_size: int, runtime) -> HarTorch:
    return HarTorch(data, spec, batch_size, runtime)
