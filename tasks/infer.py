"""Prefect task: one rollout in its own child process, tracked as one MLflow run."""

from prefect import get_run_logger, task

from tasks.child import device_env, run_child
from tasks.errors import UserError
from tasks.settings import Settings
from tasks.specs import InferSpec
from tasks.tracking import CELL_TAG, STAGE_TAG, client_for, experiment_id, mlflow_run, run_url, training_run


def resolve_model_run(settings: Settings, model_run: str):
    """The MLflow run of a finished training run: ``model_run`` itself, or the newest one for 'latest'."""
    client = client_for(settings)
    if model_run == "latest":
        runs = client.search_runs([experiment_id(client, settings)], f"tags.`{STAGE_TAG}` = 'train' and attributes.status = 'FINISHED'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        if not runs:
            raise UserError(f"no finished training run in experiment {settings.experiment!r}; run 'python -m flows train' first")
        return runs[0]
    return training_run(settings, model_run, "model run")


def check_rollout(settings: Settings, spec: InferSpec, log):
    """Every check of a rollout request that can run before any work: the model run, its channels
    against the dataset, the tiling against the frame, the workers against the cores or devices (a
    probe child for cuda and xla). Returns the model's MLflow run; UserError names what is wrong."""
    from tasks.rollout import check_workers, plan_rollout

    model = resolve_model_run(settings, spec.model_run)
    plan_rollout(settings, spec, model.info.run_id)
    if spec.device != "cpu":
        check_workers(spec, run_child("probe", {"device": spec.device}, log, env=device_env(spec.device, spec.workers)))
    return model


@task(name="rollout", task_run_name="infer {spec.mode} {spec.device} x{spec.workers}")
def rollout(settings: Settings, spec: InferSpec, parent_run_id: str | None = None) -> dict:
    logger = get_run_logger()
    model = check_rollout(settings, spec, logger)
    model_run_id = model.info.run_id
    dataset = spec.dataset or model.data.params.get("dataset", "?")
    tags = {"karman.device": spec.device, "karman.mode": spec.mode, "karman.workers": str(spec.workers), "karman.model_run": model_run_id,
            "karman.dataset": dataset, "karman.framework": model.data.params.get("framework", "torch")}
    if spec.cell:
        tags[CELL_TAG] = spec.cell
    name = f"infer-{spec.mode}-{spec.device}-w{spec.workers}"
    how = "the whole frame on one worker" if spec.mode == "full" else f"map-reduce tiles over {spec.workers} workers"
    description = (f"Rollout of {spec.steps} steps of the generator of training run {model_run_id} on {spec.device}, {how}, "
                   f"against the solver's frames of dataset `{dataset}` (simulation {spec.simulation or 'the model test simulation'}). "
                   "Per-step errors are logged against the rollout step; horizons count steps within the thresholds.")
    with mlflow_run(settings, "infer", name, params=spec.model_dump(exclude={"cell"}), tags=tags, parent_run_id=parent_run_id,
                    description=description) as run:
        dataset_dir = settings.dataset_dir(dataset)
        try:
            from tasks.store import load_manifest

            run.log_dataset(dataset, load_manifest(dataset_dir)["digest"], dataset_dir, "evaluation")
        except Exception as exc:  # the child names a missing dataset in its own words
            logger.debug("no dataset input logged: %s", exc)
        logger.info("MLflow run: %s", run_url(settings, run.run_id))
        job = {"spec": spec.model_dump(), "settings": settings.model_dump(mode="json"), "run_id": run.run_id, "model_run_id": model_run_id}
        result = run_child("rollout", job, logger, env=device_env(spec.device, spec.workers))
    return {**result, "run_id": run.run_id, "model_run_id": model_run_id}
