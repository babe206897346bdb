"""A workload's typed options: the base class every workload's options.py subclasses, and how a spec holds them."""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, SerializeAsAny
from pydantic.json_schema import WithJsonSchema


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkloadOptions(Spec):
    """A workload's own training options: what only its runs take (karman's recipe and widths, har's layers and units).
    Its folder's ``options.py`` declares them as a subclass (``TRAIN``); a run's spec holds them as its ``options``, and
    its command-line flags, MLflow params, run name and cell key come from them."""

    def check(self, spec: "TrainSpec") -> None:
        """ValueError, in one line, where these options do not fit the rest of ``spec``; none by default."""

    def params(self) -> dict[str, Any]:
        """The options as a run's MLflow params: those set (a None means 'the workload's own' and is not logged)."""
        return {k: v for k, v in self.model_dump(mode="json").items() if v is not None}

    def tags(self) -> dict[str, str]:
        """MLflow tags the workload puts on a run of these options; none by default."""
        return {}

    def name_part(self) -> str:
        """What a run's name adds for these options (har: ``l1u16``), so that no two runs of a benchmark share a name."""
        return ""

    def key_fields(self) -> dict[str, Any]:
        """The options as a cell's key hashes them."""
        return self.model_dump(mode="json")

    @classmethod
    def key_padding(cls) -> dict[str, Any]:
        """What a cell's key holds of these options for another workload's run: nothing for a workload added after options
        became a workload's own. The first four workloads' cells were keyed over one flat spec that held every one's
        options, so theirs give their defaults here and those cells keep their keys."""
        return {}


class ForeignOptions(WorkloadOptions):
    """The options of a workload this process's table does not know (a run of one kept outside it, read back), unchecked."""

    model_config = ConfigDict(extra="allow", frozen=True)


# A run form shows a workload's options as one object: which fields it takes depends on the workload chosen beside it,
# and the spec validates them by that workload's model (the form's schema would otherwise refuse every field).
AnyOptions = Annotated[SerializeAsAny[WorkloadOptions], WithJsonSchema({"type": "object", "additionalProperties": True})]
