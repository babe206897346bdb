"""Calo's own training options: none yet (its own options are its dataset's: events, energy and angle)."""

from tasks.common.specs import WorkloadOptions


class CaloOptions(WorkloadOptions):
    """The 3-D calorimeter GAN trains with the shared settings only."""


TRAIN = CaloOptions
