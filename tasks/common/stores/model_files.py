"""A training run's model artifact, read from the flow process (no framework imported): which run a request names, its metadata, and the checks of its weights file's size and checksum."""

import json
import tempfile
from pathlib import Path
from typing import Callable

from tasks.common.config.errors import UserError
from tasks.common.tracking.names import Tag
from tasks.common.tracking.registry import resolve_model_uri
from tasks.common.config.settings import Settings
from tasks.common.stores.store import file_sha256
from tasks.common.tracking.runs import client_for, missing, store_not_made, training_run

# MlflowException is imported in the functions that catch it: Dask workers import the flows' modules and need no MLflow.


def download(settings: Settings, model_run: str, path: str, tmp: str) -> Path:
    """A training run's artifact ``path`` downloaded under ``tmp``; UserError if the run has none."""
    from mlflow.exceptions import MlflowException

    try:
        return Path(client_for(settings).download_artifacts(model_run, path, tmp))
    except MlflowException as exc:
        if not missing(exc):
            raise
        raise UserError(f"training run {model_run!r} has no {path} artifact ({type(exc).__name__})") from None


def model_meta(settings: Settings, model_run: str) -> dict:
    """The metadata of a training run's model (network, normaliser, channels, dataset, split)."""
    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(download(settings, model_run, "model/meta.json", tmp).read_text())


def weights_file(meta: dict) -> str:
    """The name of a model's weights file in its 'model' artifact (runs from before it was recorded: torch's)."""
    return meta.get("weights_file", "generator.pt")


def check_model_size(settings: Settings, model_run: str, meta: dict) -> None:
    """Refuse, before any work, a model whose weights file is not the size it was written with (a
    truncated or replaced artifact); runs logged before the size was recorded are not checked here."""
    expected = meta.get("generator_bytes")
    if expected is None:
        return
    name = weights_file(meta)
    listed = {f.path: f.file_size for f in client_for(settings).list_artifacts(model_run, "model")}
    found = listed.get(f"model/{name}")
    if found != expected:
        raise UserError(f"the model artifact model/{name} of training run {model_run} has {found} bytes, not the {expected} "
                        "it was written with: it is truncated or damaged; train again or roll out another run")


def check_model_file(path: Path, model_run: str, meta: dict) -> None:
    """Refuse a downloaded weights file whose checksum differs from the one recorded when it was written."""
    expected = meta.get("generator_sha256")
    if expected is not None and file_sha256(path) != expected:
        raise UserError(f"the model artifact model/{path.name} of training run {model_run} is damaged (its SHA-256 differs "
                        "from the one recorded when it was written); train again or roll out another run")


def checked_weights(settings: Settings, model_run: str, tmp: str) -> tuple[Path, dict]:
    """A training run's 'model' artifact downloaded under ``tmp``: its weights file, checked against the checksum it was
    written with, and its metadata."""
    local = download(settings, model_run, "model", tmp)
    meta = json.loads((local / "meta.json").read_text())
    path = local / weights_file(meta)
    check_model_file(path, model_run, meta)
    return path, meta


def resolve_model_run(settings: Settings, model_run: str, takes: Callable | None = None, which: str = "training run"):
    """The MLflow run of a finished training run: ``model_run`` itself, the newest one for 'latest' (of the newest 200, the
    first that ``takes(run)`` accepts, where it is given; ``which`` says what they are), or the run whose model a registered
    model's URI (models:/NAME@ALIAS, models:/NAME/VERSION) names."""
    if model_run.startswith("models:/"):
        model_run = resolve_model_uri(settings, model_run)
    if model_run == "latest":
        # (looked up, not created: a refused request leaves neither a store nor an experiment behind)
        client = None if store_not_made(settings) else client_for(settings)
        experiment = None if client is None else client.get_experiment_by_name(settings.experiment)
        runs = [] if experiment is None else client.search_runs(
            [experiment.experiment_id], f"tags.`{Tag.STAGE}` = 'train' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"], max_results=1 if takes is None else 200)
        runs = [r for r in runs if takes is None or takes(r)]
        if not runs:
            raise UserError(f"no finished {which} in experiment {settings.experiment!r}; run 'python -m flows train' first")
        return runs[0]
    return training_run(settings, model_run, "model run")
