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


@task(name="find-finished-cell", retries=3, retry_delay_seconds=[2, 5, 15])
def finished_cell(settings: Settings, key: str) -> dict | None:
    """The newest FINISHED run tagged with cell ``key`` ({run_id, metrics}), or None. Retried: the
    tracking server may be briefly unreachable."""
    client = client_for(settings)
    runs = client.search_runs([experiment_id(client, settings)], f"tags.`{CELL_TAG}` = '{key}' and attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        return None
    return {"run_id": runs[0].info.run_id, "metrics": dict(runs[0].data.metrics)}


@task(name="failed-cell-message", retries=3, retry_delay_seconds=[2, 5, 15])
def cell_error(settings: Settings, key: str, since_ms: int) -> str | None:
    """The error tag of the newest run of cell ``key`` started at or after ``since_ms`` (epoch ms), if any."""
    client = client_for(settings)
    runs = client.search_runs([experiment_id(client, settings)],
                              f"tags.`{CELL_TAG}` = '{key}' and attributes.start_time >= {since_ms}",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].data.tags.get("karman.error") if runs else None


@task(name="record-failed-cell", retries=3, retry_delay_seconds=[2, 5, 15])
def record_failed_cell(settings: Settings, stage: str, name: str, key: str, error: str, params: dict) -> str:
    """A FAILED MLflow run for a cell that failed before opening its own run (refused input, a lost
    worker), so the report lists it; returns its id."""
    client = client_for(settings)
    run = client.create_run(experiment_id(client, settings), run_name=name,
                            tags={STAGE_TAG: stage, CELL_TAG: key, "karman.error": error[:5000]})
    for name_, value in params.items():
        client.log_param(run.info.run_id, name_, value)
    client.set_terminated(run.info.run_id, "FAILED")
    return run.info.run_id


@task(name="find-interrupted-cell", retries=3, retry_delay_seconds=[2, 5, 15])
def interrupted_cell(settings: Settings, key: str) -> str | None:
    """The newest run of cell ``key`` that was left RUNNING (its process was killed) or FAILED, if any."""
    client = client_for(settings)
    runs = client.search_runs([experiment_id(client, settings)],
                              f"tags.`{CELL_TAG}` = '{key}' and attributes.status != 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None
