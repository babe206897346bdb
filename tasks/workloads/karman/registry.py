"""karman's entry in the Model Registry: the best Kármán surrogate under one registered-model name with the alias ``champion``.

A benchmark offers its karman training runs: the one that reached the quality target fastest (or, if
none did, the one with the longest last validation horizon) becomes a version of the registered model,
tagged with its dataset digest, quality target and score. The alias moves to it only when it beats
the current champion on the same dataset digest and target; a champion of another dataset or target
is not comparable and keeps the alias.
"""

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tasks.common.tracking.names import Tag
from tasks.common.records import RECORD_FILE, TrainRecord
from tasks.common.tracking.registry import CHAMPION
from tasks.common.config.settings import Settings
from tasks.common.tracking.runs import client_for, missing
from tasks.common.specs import TrainSpec

QUALITY_TARGET = "karman.quality_target"  # a model version's quality target in words
SCORE = "karman.score"  # a model version's score in words
REACHED = "karman.target_reached"
TIME_TO_TARGET = "karman.time_to_target_s"
HORIZON = "karman.val_horizon_vorticity"
FLOOR_SHARE = 0.5  # a model that missed the target may be champion only with a validation horizon of at least this share of the target's steps


def spec_target(spec: TrainSpec) -> str:
    """The quality target of a karman run, in words, from its spec (TrainSpec)."""
    return f"vorticity <= {spec.options.target_vorticity:g} for {spec.options.target_steps} steps"


@dataclass(frozen=True)
class Candidate:
    """A trained surrogate as the registry compares it."""

    run_id: str
    model_uri: str
    dataset_digest: str
    target: str
    reached: bool
    time_to_target_s: float | None
    horizon: float | None  # the last validation rollout's vorticity horizon (steps)
    floor: float | None = None  # the horizon (steps) below which a model that missed the target is no champion; None: not known

    @property
    def eligible(self) -> bool:
        """Whether it may hold the alias: it reached the target, or its horizon is at least the floor."""
        return self.reached or (self.horizon is not None and self.floor is not None and self.horizon >= self.floor)

    def rank(self) -> tuple[int, float]:
        """Larger is better: any run that reached the target before any that did not; then the faster, or the longer horizon."""
        if self.reached:
            return 1, -(self.time_to_target_s if self.time_to_target_s is not None else math.inf)
        return 0, self.horizon if self.horizon is not None else -math.inf

    @property
    def score(self) -> str:
        if self.reached:
            return f"reached the target in {self.time_to_target_s:.4g} s"
        return f"target not reached; validation vorticity horizon {self.horizon:g} steps" if self.horizon is not None else "target not reached"

    def comparable(self, other: "Candidate") -> bool:
        return (self.dataset_digest, self.target) == (other.dataset_digest, other.target)

    def beats(self, champion: "Candidate | None") -> bool:
        """Whether this model takes the alias from ``champion`` (None: there is none yet)."""
        return champion is None or (self.comparable(champion) and self.rank() > champion.rank())

    def tags(self) -> dict[str, str]:
        """The version's tags: a figure that is not known is left out, never written as the string 'None'."""
        figures = {TIME_TO_TARGET: self.time_to_target_s, HORIZON: self.horizon}
        return {Tag.DATASET_DIGEST: self.dataset_digest, QUALITY_TARGET: self.target, SCORE: self.score, REACHED: str(self.reached),
                Tag.MODEL_RUN: self.run_id, **{k: repr(v) for k, v in figures.items() if v is not None}}

    @classmethod
    def from_version(cls, version) -> "Candidate":
        """The candidate a registered version was, from its tags."""
        t = version.tags

        def number(key: str) -> float | None:
            return None if t.get(key, "None") == "None" else float(t[key])

        return cls(version.run_id, version.source, t.get(Tag.DATASET_DIGEST, ""), t.get(QUALITY_TARGET, ""), t.get(REACHED) == "True",
                   number(TIME_TO_TARGET), number(HORIZON))

    @classmethod
    def from_run(cls, run, record: TrainRecord) -> "Candidate | None":
        """A finished karman training run with a logged model; None for any other."""
        s, model_uri = record.summary, run.data.tags.get(Tag.MODEL_URI)
        if record.config.workload != "karman" or s is None or not model_uri or run.info.status != "FINISHED":
            return None
        return cls(run.info.run_id, model_uri, record.config.dataset_digest, spec_target(record.config.spec), s.target_reached,
                   s.time_to_target_s, s.validation.get("horizon_vorticity"), FLOOR_SHARE * record.config.spec.options.target_steps)


def candidate(client, run_id: str) -> Candidate | None:
    """The candidate training run ``run_id`` is, from its record; None where it is none (or its record is missing)."""
    from mlflow.exceptions import MlflowException

    run = client.get_run(run_id)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            record = TrainRecord.model_validate_json(Path(client.download_artifacts(run_id, RECORD_FILE, tmp)).read_text())
    except (MlflowException, OSError, ValueError):
        return None
    return Candidate.from_run(run, record)


def champion(client, name: str) -> tuple[object, Candidate] | None:
    """(the model version holding the alias, its candidate), or None where the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException as exc:
        if not missing(exc):
            raise
        return None
    return version, Candidate.from_version(version)


def register_champion(settings: Settings, run_ids: list[str]) -> dict:
    """Register the best of the training runs ``run_ids`` as a version of the settings' registered model (once per run)
    and move the alias ``champion`` to it if it beats the current one; what was done, with the reason."""
    from mlflow.exceptions import MlflowException

    client, name = client_for(settings), settings.registered_model
    offered = [c for rid in dict.fromkeys(run_ids) if (c := candidate(client, rid)) is not None]
    if not offered:
        return {"name": name, "version": None, "champion": False, "reason": "no model registered: no finished karman training run with a logged model"}
    best = max(offered, key=Candidate.rank)
    if not best.eligible:  # a model that missed the target and holds the flow for too few steps is registered nowhere
        return {"name": name, "version": None, "champion": False, "run_id": best.run_id, "score": best.score,
                "reason": f"no model registered: the best ({best.score}) missed the target and holds vorticity for fewer than "
                          f"{best.floor:g} steps, {FLOOR_SHARE:g} of the target's"}
    try:
        client.create_registered_model(name, description="Kármán Bench surrogates: the best generator of each benchmark; "
                                                          "the alias 'champion' marks the best on its dataset digest and target.")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    known = client.search_model_versions(f"name='{name}' and run_id='{best.run_id}'")
    version = known[0] if known else client.create_model_version(
        name, source=best.model_uri, run_id=best.run_id, tags=best.tags(), model_id=best.model_uri.removeprefix("models:/"),
        description=f"Training run {best.run_id}: {best.score} ({best.target}, data {best.dataset_digest[:8]}).")
    held = champion(client, name)
    current = held[1] if held else None
    if held and held[0].version == version.version:
        reason = "it is the champion already"
    elif best.beats(current):
        client.set_registered_model_alias(name, CHAMPION, version.version)
        reason = "first champion" if current is None else f"beats version {held[0].version} ({current.score})"
    elif not best.comparable(current):
        reason = f"version {held[0].version} stays champion: it was judged on another dataset digest or target ({current.target}, data {current.dataset_digest[:8]})"
    else:
        reason = f"version {held[0].version} stays champion: {current.score}"
    won = champion(client, name)[0].version == version.version
    return {"name": name, "version": int(version.version), "run_id": best.run_id, "score": best.score, "champion": won,
            "uri": f"models:/{name}@{CHAMPION}", "reason": reason}
