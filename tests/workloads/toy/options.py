"""The toy workload's own training option: the width of its MLP's hidden layer."""

from pydantic import Field, PositiveInt

from tasks.common.specs import WorkloadOptions


class ToyOptions(WorkloadOptions):
    """The MLP 2-H-2's width."""

    hidden: PositiveInt = Field(default=16, le=1024, description="Units of the MLP's hidden layer")

    def name_part(self) -> str:
        return f"h{self.hidden}" if self.hidden != 16 else ""


TRAIN = ToyOptions
