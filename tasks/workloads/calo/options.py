"""Calo's own options: its dataset's showers (how many, their energies and angles); its training takes the shared settings only."""

from typing import Any

from pydantic import Field, PositiveFloat, PositiveInt

from tasks.common.specs import WorkloadOptions


class CaloOptions(WorkloadOptions):
    """The 3-D calorimeter GAN trains with the shared settings only."""


class CaloShowers(WorkloadOptions):
    """The synthetic showers its generate simulates."""

    events: PositiveInt = Field(default=5000, le=10_000_000, description="synthetic showers to simulate (a fifth each held out for validation and test)")
    energy: list[PositiveFloat] = Field(default=[100.0, 200.0], min_length=2, max_length=2, description="primary energy range in GeV, low then high (uniform)")
    angle: list[PositiveFloat] = Field(default=[60.0, 120.0], min_length=2, max_length=2, description="incidence angle range in degrees, the shower axis against the y axis (90 = perpendicular to the layers), low then high (uniform)")


TRAIN, GENERATE = CaloOptions, CaloShowers
