"""The order of an epoch's samples and its seed, the same for every workload and framework.

A function of (seed, epoch [, rank]) only, so every rank and a resumed run see the same."""

import numpy as np


def epoch_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """The torch seed of one epoch on one rank (dropout, input noise), independent of what ran before."""
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])


def epoch_order(n_pairs: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled pair order of one epoch: a function of (seed, epoch) only, so every rank and a
    resumed run see the same order."""
    return np.random.default_rng([seed, epoch]).permutation(n_pairs)
