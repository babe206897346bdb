"""Benchmark cells: a key per cell from its inputs and the dataset digest, and the lookup of a cell's
finished MLflow run, so that a rerun of the benchmark skips what is done."""

import hashlib
import json

from prefect import task
from pydantic import BaseModel

from tasks.settings import Settings
from tasks.tracking import CELL_TAG, STAGE_TAG, client_for, experiment_id


def cell_key(kind: str, spec: BaseModel, dataset_digest: str) -> str:
    """16 hex digits of SHA-256 over the cell's kind, its full spec and the dataset's digest."""
    payload = {"kind": kind, "spec": spec.model_dump(mode="json", exclude={"cell"}), "dataset_digest": dataset_digest}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


# MLflow calls are retried: the tracking server may be briefly unreachable.
RETRIES = {"retries": 3, "retry_delay_seconds": [2, 5, 15]}


def _newest_run(settings: Settings, key: str, condition: str):
    """The newest run tagged with cell ``key`` that meets the MLflow filter ``condition``, or None."""
    client = client_for(settings)
    runs = client.search_runs([experiment_id(client, settings)], f"tags.`{CELL_TAG}` = '{key}' and {condition}",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


@task(name="find-finished-cell", **RETRIES)
def finished_cell(settings: Settings, key: str) -> str | None:
    """The id of the newest FINISHED run of cell ``key``, or None."""
    run = _newest_run(settings, key, "attributes.status = 'FINISHED'")
    return run.info.run_id if run else None


@task(name="failed-cell-message", **RETRIES)
def cell_error(settings: Settings, key: str, since_ms: int) -> str | None:
    """The error tag of the newest run of cell ``key`` started at or after ``since_ms`` (epoch ms), if any."""
    run = _newest_run(settings, key, f"attributes.start_time >= {since_ms}")
    return run.data.tags.get("karman.error") if run else None


@task(name="find-interrupted-cell", **RETRIES)
def interrupted_cell(settings: Settings, key: str) -> str | None:
    """The newest run of cell ``key`` that was left RUNNING (its process was killed) or FAILED, if any."""
    run = _newest_run(settings, key, "attributes.status != 'FINISHED'")
    return run.info.run_id if run else None


@task(name="record-failed-cell", **RETRIES)
def record_failed_cell(settings: Settings, stage: str, name: str, key: str, error: str, params: dict) -> str:
    """A FAILED MLflow run for a cell that failed before opening its own run (refused input, a lost
    worker), so the report lists it; returns its id."""
    client = client_for(settings)
    run = client.create_run(experiment_id(client, settings), run_name=name,
                            tags={STAGE_TAG: stage, CELL_TAG: key, "karman.error": error[:5000]})
    for param, value in params.items():
        client.log_param(run.info.run_id, param, value)
    client.set_terminated(run.info.run_id, "FAILED")
    return run.info.run_id
