"""What the report reads from MLflow: the runs it covers, and each run's typed record."""

import tempfile
from dataclasses import dataclass
from pathlib import Path

from tasks.common.tracking.names import Tag
from tasks.common.records import RECORD_FILE, RolloutRecord, TrainRecord
from tasks.common.config.settings import Settings
from tasks.common.specs import AggregateSpec
from tasks.common.tracking.runs import client_for, missing, store_not_made

# MlflowException is imported in the functions that catch it: Dask workers import the flows' modules and need no MLflow.


@dataclass(frozen=True)
class Entry:
    """A run as the report reads it: MLflow's facts of the run and its typed record (TrainRecord or RolloutRecord)."""

    run_id: str
    run_name: str
    status: str
    error: str
    record: TrainRecord | RolloutRecord


def read_records(client, runs, kind: type[TrainRecord] | type[RolloutRecord], finished_by: str) -> tuple[list[Entry], list[str]]:
    """The record of every finished or failed run: its record.json, or for a run logged before records
    existed, the record read back from its params (``finished_by``: the metric a finished run of that
    version has). Also one line for each run left out and why."""
    from pydantic import ValidationError

    entries, left_out = [], []
    for r in runs:
        if r.info.status not in ("FINISHED", "FAILED"):
            continue
        finished = r.info.status == "FINISHED" and finished_by in r.data.metrics
        try:
            if any(a.path == RECORD_FILE for a in client.list_artifacts(r.info.run_id)):
                with tempfile.TemporaryDirectory() as tmp:
                    record = kind.model_validate_json(Path(client.download_artifacts(r.info.run_id, RECORD_FILE, tmp)).read_text())
            elif kind is TrainRecord:
                record = TrainRecord.from_mlflow(r.data.params, r.data.metrics, finished)
            else:
                record = RolloutRecord.from_mlflow(r.data.params, r.data.metrics, r.data.tags, finished)
        except ValidationError as exc:
            left_out.append(f"{r.info.run_name} ({r.info.run_id[:8]}): its record does not read ({exc.errors()[0]['msg']})")
            continue
        status = "FINISHED" if finished and record.summary is not None else "FAILED"
        entries.append(Entry(r.info.run_id, r.info.run_name or "", status, r.data.tags.get(Tag.ERROR, "")[:120], record))
    return entries, left_out


def training_records(client, runs) -> tuple[list[Entry], list[str]]:
    """The records of training runs (see read_records)."""
    return read_records(client, runs, TrainRecord, "time_per_epoch_s")


def rollout_records(client, runs) -> tuple[list[Entry], list[str]]:
    """The records of rollout runs (see read_records)."""
    return read_records(client, runs, RolloutRecord, "frames_per_s")


def _rows(client, exp_id: str, stage: str) -> list:
    return client.search_runs([exp_id], f"tags.`{Tag.STAGE}` = '{stage}'", order_by=["attributes.start_time ASC"], max_results=1000)


def covered_runs(settings: Settings, client, exp_id: str, source: str) -> tuple[str, list, list[str]]:
    """(what the report covers, in words; the runs; one line per run it leaves out, saying why): the runs a
    benchmark or demo run recorded in its runs.json ('latest' = the newest such run, or its id); or 'all'
    of the experiment. A recorded run that is deleted since is left out."""
    import json

    from mlflow.exceptions import MlflowException

    from tasks.common.config.errors import UserError

    if source == "all":
        runs = [r for stage in ("train", "infer") for r in _rows(client, exp_id, stage)]
        return f"every training and rollout run of experiment `{settings.experiment}`", runs, []
    if source == "latest":
        found = sorted((r for stage in ("benchmark", "demo") for r in client.search_runs(
            [exp_id], f"tags.`{Tag.STAGE}` = '{stage}'", order_by=["attributes.start_time DESC"], max_results=1)),
            key=lambda r: r.info.start_time, reverse=True)
        if not found:
            raise UserError(f"no benchmark or demo run in experiment {settings.experiment!r} to report on; run one, or use --runs all")
        owner = found[0]
    else:
        try:
            owner = client.get_run(source)
        except MlflowException as exc:
            if not missing(exc):
                raise
            raise UserError(f"unknown run {source!r} in the tracking store {settings.tracking_uri}") from None
        if owner.data.tags.get(Tag.STAGE) not in ("benchmark", "demo"):
            raise UserError(f"run {source!r} is not a benchmark or demo run (stage {owner.data.tags.get(Tag.STAGE)!r}); give one, latest or all")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            listed = json.loads(Path(client.download_artifacts(owner.info.run_id, "runs.json", tmp)).read_text())
            run_ids, stopped = listed["runs"], listed.get("stopped")  # stopped: how a benchmark stopped by a signal ended
        except MlflowException as exc:
            if not missing(exc):
                raise
            raise UserError(f"run {owner.info.run_id} lists no runs (runs.json); it did not get to its cells") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"run {owner.info.run_id} has no readable list of runs (runs.json: {type(exc).__name__}: {exc})") from None
    scope = f"the runs of {owner.data.tags.get(Tag.STAGE)} run {owner.info.run_name} ({owner.info.run_id})" + (f", {stopped}" if stopped else "")
    runs, left_out = [], []
    for rid in dict.fromkeys(run_ids):
        try:
            run = client.get_run(rid)
        except MlflowException as exc:
            if not missing(exc):
                raise
            left_out.append(f"{rid}: no longer in the tracking store ({exc.error_code})")
            continue
        if run.info.lifecycle_stage == "deleted":
            left_out.append(f"{rid} ({run.info.run_name}): deleted")
            continue
        runs.append(run)
    return scope, runs, left_out


def check_report_source(settings: Settings, spec: AggregateSpec) -> None:
    """UserError, before any run or file is written, when the runs the report should cover cannot be found."""
    from tasks.common.config.errors import UserError

    client = None if store_not_made(settings) else client_for(settings)
    exp = None if client is None else client.get_experiment_by_name(settings.experiment)
    if exp is None:
        raise UserError(f"experiment {settings.experiment!r} does not exist in the tracking store {settings.tracking_uri}; run a benchmark or the demo first")
    covered_runs(settings, client, exp.experiment_id, spec.runs)
