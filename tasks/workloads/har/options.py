"""Har's own training options: the network's depth and width (seed 002's axes) and its learning-rate schedule."""

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


TRAIN = HarOptions
