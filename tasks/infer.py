"""Prefect task: one rollout in its own child process, tracked as one MLflow run."""

from prefect import get_run_logger, task

from tasks.child import device_env, run_child
from tasks.errors import UserError
from tasks.settings import Settings
from tasks.specs import InferSpec
from tasks.tracking import STAGE_TAG, client_for, experiment_id, mlflow_run, training_run


def resolve_model_run(settings: Settings, model_run: str) -> str:
    """The id of a finished training run: ``model_run`` itself, or the newest one for 'latest'."""
    client = client_for(settings)
    if model_run == "latest":
        runs = client.search_runs([experiment_id(client, settings)], f"tags.`{STAGE_TAG}` = 'train' and attributes.status = 'FINISHED'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        if not runs:
            raise UserError(f"no finished training run in experiment {settings.experiment!r}; run 'python -m flows train' first")
        return runs[0].info.run_id
    training_run(settings, model_run, "model run")
    return model_run


@task(name="rollout")
def rollout(settings: Settings, spec: InferSpec, parent_run_id: str | None = None) -> dict:
    logger = get_run_logger()
    model_run_id = resolve_model_run(settings, spec.model_run)
    tags = {"karman.device": spec.device, "karman.mode": spec.mode, "karman.model_run": model_run_id}
    with mlflow_run(settings, "infer", f"infer-{spec.mode}-{spec.device}", params=spec.model_dump(), tags=tags, parent_run_id=parent_run_id) as run:
        job = {"spec": spec.model_dump(), "settings": settings.model_dump(mode="json"), "run_id": run.run_id, "model_run_id": model_run_id}
        result = run_child("rollout", job, logger, env=device_env(spec.device))
    return {**result, "run_id": run.run_id, "model_run_id": model_run_id}
