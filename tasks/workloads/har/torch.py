"""The har workload in PyTorch: models.har.torch's BiLSTM from the workload's numpy initial weights, one Adam step per batch, logits for scoring."""

import torch

from models.har.torch import HarBiLSTM
from tasks.common.runtimes.classifier_torch import TorchClassifier
from tasks.workloads.har.workload import EPSILON, LEARNING_RATE, HarData, HarTrainer


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
