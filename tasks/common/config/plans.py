"""A stage's plan made once per command: the CLI's preflight hands its plan to the flow it starts, which takes it instead of planning again."""

from pydantic import BaseModel

_handed: dict[str, object] = {}  # spec JSON -> the plan made for it, until the flow takes it


def _key(stage: str, spec: BaseModel) -> str:
    return f"{stage}:{spec.model_dump_json()}"


def hand_over(stage: str, spec: BaseModel, plan: object) -> None:
    """Keep ``plan`` for the next ``take`` of the same stage and spec in this process."""
    _handed[_key(stage, spec)] = plan


def take(stage: str, spec: BaseModel):
    """The plan handed over for this stage and spec (once: a second take finds nothing), or None."""
    return _handed.pop(_key(stage, spec), None)
