"""The benchmark matrix's cells: a key per cell, and the lookup of its finished MLflow run so that a rerun skips it.

A cell's key comes from its inputs and the dataset digest.
"""

import hashlib
import json

from prefect import task
from pydantic import BaseModel

from tasks.common.tracking.flowrun import flow_run_link
from tasks.common.tracking.names import Tag
from tasks.common.config.settings import Settings
from tasks.common.tracking.runs import client_for, experiment_id


def cell_key(kind: str, spec: BaseModel, dataset_digest: str) -> str:
    """16 hex digits of SHA-256 over the cell's kind, its full spec (as its ``key_fields()`` gives it, where it has them)
    and the dataset's digest."""
    fields = spec.key_fields() if hasattr(spec, "key_fields") else spec.model_dump(mode="json", exclude={"cell"})
    payload = {"kind": kind, "spec": fields, "dataset_digest": dataset_digest}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def keyed(job, kind: str, dataset_digest: str, **update):
    """A planned cell (a dataclass with a ``spec``: flows.matrix.Job) whose spec takes ``update`` and its cell key, over its
    ``kind``, the updated spec and the digest of the dataset it trains on (known once the dataset is made)."""
    import dataclasses

    spec = job.spec.model_copy(update=update)
    return dataclasses.replace(job, spec=spec.model_copy(update={"cell": cell_key(kind, spec, dataset_digest)}))


# Lookups are plain calls, not Prefect tasks, so that a benchmark's graph shows its cells, not a dozen
# lookups. Against a tracking server, MLflow's client retries a request itself when the server is briefly
# unreachable or answers 408, 429 or 5xx (MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR,
# MLFLOW_HTTP_REQUEST_TIMEOUT); what still fails after those retries ends the lookup.

def _newest_run(settings: Settings, key: str, condition: str):
    """The newest run tagged with cell ``key`` that meets the MLflow filter ``condition``, or None."""
    client = client_for(settings)
    runs = client.search_runs([experiment_id(client, settings)], f"tags.`{Tag.CELL}` = '{key}' and {condition}",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def finished_cell(settings: Settings, key: str) -> str | None:
    """The id of the newest FINISHED run of cell ``key``, or None."""
    run = _newest_run(settings, key, "attributes.status = 'FINISHED'")
    return run.info.run_id if run else None


def cell_error(settings: Settings, key: str, since_ms: int, resumed: str | None = None) -> tuple[str, str, str] | None:
    """(run id, error tag, status) of the newest run of cell ``key`` started at or after ``since_ms`` (epoch ms), else of
    the run ``resumed`` (a reopened run keeps its first start time), if any."""
    run = _newest_run(settings, key, f"attributes.start_time >= {since_ms}")
    if run is None and resumed:
        run = client_for(settings).get_run(resumed)
    return (run.info.run_id, run.data.tags.get(Tag.ERROR) or f"run ended {run.info.status}", run.info.status) if run else None


def interrupted_cell(settings: Settings, key: str) -> str | None:
    """The newest run of cell ``key`` that ended KILLED or FAILED, if any. A run still RUNNING is not
    taken: runs whose driver on this host is gone were marked KILLED before (tasks.common.tracking.runs.
    reap_orphans), so a RUNNING one is alive, or driven from another host where nothing proves it dead."""
    run = _newest_run(settings, key, "attributes.status != 'FINISHED'")
    return run.info.run_id if run and run.info.status != "RUNNING" else None


@task(name="record-failed-cell", task_run_name="record failed cell {name}", retries=3, retry_delay_seconds=[2, 5, 15])
def record_failed_cell(settings: Settings, stage: str, name: str, key: str, error: str, params: dict, parent_run_id: str | None = None) -> str:
    """A FAILED MLflow run for a cell that failed before opening its own run (refused input, a lost
    worker), so the report lists it; returns its id."""
    client = client_for(settings)
    link = flow_run_link()  # the benchmark's flow run
    description = f"A {stage} cell that failed before it opened a run of its own: {error[:500]}" + (f"\n\n{link.markdown()}" if link else "")
    tags = {Tag.STAGE: stage, Tag.CELL: key, Tag.ERROR: error[:5000], Tag.DESCRIPTION: description, **(link.tags() if link else {})}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(experiment_id(client, settings), run_name=name, tags=tags)
    for param, value in params.items():
        client.log_param(run.info.run_id, param, value)
    client.set_terminated(run.info.run_id, "FAILED")
    return run.info.run_id
