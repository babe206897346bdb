"""Prefect task: one training run in its own child process, tracked as one MLflow run."""

from prefect import get_run_logger, task

from tasks.child import device_env, run_child
from tasks.settings import Settings
from tasks.specs import TrainSpec
from tasks.store import load_manifest
from tasks.tracking import mlflow_run


@task(name="train-model")
def train_model(settings: Settings, spec: TrainSpec, parent_run_id: str | None = None) -> dict:
    """Train Pix2Pix on the dataset in a child process for the spec's device; returns its summary."""
    logger = get_run_logger()
    digest = load_manifest(settings.dataset_dir(spec.dataset))["digest"]
    name = f"train-{spec.device}-b{spec.batch_size}"
    tags = {"karman.device": spec.device, "karman.dataset": spec.dataset, "karman.dataset_digest": digest}
    with mlflow_run(settings, "train", name, params=spec.model_dump(), tags=tags, parent_run_id=parent_run_id) as run:
        job = {"spec": spec.model_dump(), "settings": settings.model_dump(mode="json"), "run_id": run.run_id}
        result = run_child("train", job, logger, env=device_env(spec.device))
    return {**result, "run_id": run.run_id}


@task(name="probe-device")
def probe_device(device: str) -> dict:
    """Open the device in a child process; fails fast naming what is missing."""
    return run_child("probe", {"device": device}, get_run_logger(), env=device_env(device))
