"""The digits workload in PyTorch: models.digits.torch's CNN from the workload's numpy initial weights, one SGD-momentum step per batch, logits for scoring."""

import torch

from models.digits.torch import DigitsCNN
from tasks.common.runtimes.classifier_torch import TorchClassifier
from tasks.workloads.digits.workload import LEARNING_RATE, MOMENTUM, DigitsData, DigitsTrainer, initial_weights


class DigitsTorch(DigitsTrainer, TorchClassifier):
    def __init__(self, data: DigitsData, spec, batch_size: int, runtime):
        super().__init__(data, spec, batch_size, *self.share(runtime))
        net = DigitsCNN()
        net.load_weights(initial_weights(spec.seed))  # the same on every rank and in every framework
        self._place(runtime, net)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)


def build(data: DigitsData, spec, batch_size: int, runtime) -> DigitsTorch:
    return DigitsTorch(data, spec, batch_size, runtime)
