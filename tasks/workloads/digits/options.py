"""Digits' own training option: its quality target."""

from typing import Any

from pydantic import Field

from tasks.common.specs import WorkloadOptions


class DigitsOptions(WorkloadOptions):
    """The MNIST CNN's target; None = the workload's own (tasks.workloads.digits.workload)."""

    target_accuracy: float | None = Field(default=None, gt=0, le=1, description="Quality target: validation accuracy at least this; None = the workload's own")

    @classmethod
    def key_padding(cls) -> dict[str, Any]:
        return DigitsOptions().key_fields()


TRAIN = DigitsOptions
