"""MLflow behind one context manager: every run is opened, tagged and closed here."""

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from tasks.settings import Settings

log = logging.getLogger(__name__)
STAGE_TAG = "karman.stage"


def _flatten(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:6000]
    return out


def experiment_id(client: MlflowClient, settings: Settings) -> str:
    """The experiment's id, creating it (artifacts under the artifact root for local stores) if needed."""
    exp = client.get_experiment_by_name(settings.experiment)
    if exp is not None:
        return exp.experiment_id
    location = None
    if not settings.tracking_uri.startswith(("http://", "https://", "databricks")):
        location = settings.artifact_root.as_uri()
    return client.create_experiment(settings.experiment, artifact_location=location)


class Run:
    """A handle on an open MLflow run."""

    def __init__(self, client: MlflowClient, run_id: str):
        self.client, self.run_id = client, run_id

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        import time

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 500):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 500])

    def log_params(self, params: dict[str, Any]) -> None:
        flat = [Param(k, v) for k, v in _flatten(params).items()]
        for i in range(0, len(flat), 100):
            self.client.log_batch(self.run_id, params=flat[i : i + 100])

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if Path(path).is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)


def client_for(settings: Settings) -> MlflowClient:
    return MlflowClient(tracking_uri=settings.tracking_uri)


@contextlib.contextmanager
def mlflow_run(
    settings: Settings,
    stage: str,
    name: str,
    params: dict[str, Any] | None = None,
    tags: dict[str, Any] | None = None,
    parent_run_id: str | None = None,
) -> Iterator[Run]:
    """Open a run of ``stage`` in the settings' experiment; it ends FINISHED, or FAILED on any exception."""
    client = client_for(settings)
    run_tags = {STAGE_TAG: stage, **(tags or {})}
    if parent_run_id:
        run_tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(experiment_id(client, settings), run_name=name, tags={k: str(v) for k, v in run_tags.items()})
    handle = Run(client, run.info.run_id)
    try:
        if params:
            handle.log_params(params)
        yield handle
    except BaseException as exc:
        handle.set_tags({"karman.error": f"{type(exc).__name__}: {exc}"[:5000]})
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    else:
        client.set_terminated(run.info.run_id, "FINISHED")
