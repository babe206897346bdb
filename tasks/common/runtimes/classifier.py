"""What every framework's trainer of a classifier shares, whatever the workload (digits, har).

The shared part holds the data in memory, this rank's share of each global batch in the loop's order, validation and
test scores from the framework's logits, and the trained weights as the run's model. A workload's trainer adds its
network's size, scores, target and record; a framework's (classifier_torch, classifier_keras, classifier_jax) adds the
step, the logits, the weights and the checkpoint state."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.common.runtimes.data import epoch_order



@dataclass
class ClassifierData:
    """The three roles' inputs (n, ...) float32 and labels (n,) int64, held in memory."""

    x: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    split: dict[str, list[str]]  # the record's account of the split, in words
    dataset_digest: str
    target: float
    in_memory: bool = True


def at_chance(classes: int, score: str = "accuracy") -> Callable[[dict], str | None]:
    """A classifier workload's ``learned_nothing``: a test ``score`` (accuracy) of at most twice chance's, 1/``classes``,
    says the run learned nothing (it diverged, or its rate never moved it off a constant guess)."""
    floor = 2 / classes

    def learned_nothing(test: dict) -> str | None:
        value = test.get(score)
        if value is None or value > floor:
            return None
        return f"test {score} {value:.3g} is at chance (1/{classes} = {1 / classes:.3g} over {classes} classes; at most {floor:.3g} counts as chance)"
    return learned_nothing


class Classifier:
    """The framework-neutral part; ``scores_of(logits, labels)`` is the workload's, ``score_chunk`` the samples scored at once."""

    framework = "?"
    score_chunk = 500

    def __init__(self, data: ClassifierData, spec, batch_size: int, rank: int = 0, world: int = 1):
        self.data, self.spec, self.batch_size, self.rank, self.world = data, spec, batch_size, rank, world
        self.samples = len(data.y["train"])
        self.has_validation = True
        self.speed = {}

    def _device(self, x: np.ndarray, y: np.ndarray):
        return x, y

    def batches(self, epoch: int, steps: int):
        """This rank's (inputs (b, ...), labels (b,)) of each global batch, in the epoch's order."""
        b, local = self.batch_size, self.batch_size // self.world
        order = epoch_order(self.samples, self.spec.seed, epoch)
        for s in range(steps):
            take = order[s * b: (s + 1) * b][self.rank * local: (self.rank + 1) * local]
            yield self._device(self.data.x["train"][take], self.data.y["train"][take])

    def epoch_metrics(self) -> dict[str, float]:
        return {}

    def scores_of(self, logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        raise NotImplementedError

    def logits(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def weights(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def score(self, role: str) -> dict[str, float]:
        x = self.data.x[role]
        logits = np.concatenate([self.logits(x[i: i + self.score_chunk]) for i in range(0, len(x), self.score_chunk)])
        return self.scores_of(logits, self.data.y[role])

    def evaluate(self) -> dict[str, float]:
        return self.score("val")

    def save_weights(self, run_dir: Path, run, filename: str) -> None:
        """The trained weights (npz, '/' in names as '__') as the run's model artifact."""
        model_dir = run_dir / "model"
        model_dir.mkdir(exist_ok=True)
        np.savez(model_dir / filename, **{k.replace("/", "__"): v for k, v in self.weights().items()})
        run.log_artifact(model_dir, "model")
