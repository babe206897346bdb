"""Prefect task (flow process): one rollout planned once, carried out in its own child process, tracked as one MLflow run."""

from prefect import get_run_logger, task

from tasks.common.process.launch import device_env, run_child
from tasks.common.tracking.names import Tag, infer_label, infer_run_name
from tasks.common.config.settings import Settings
from tasks.common.specs import InferSpec
from tasks.common.stores.store import load_manifest
from tasks.common.tracking.runs import mlflow_run, run_url
from tasks.infer.plan import plan_rollout


@task(name="rollout", task_run_name=lambda parameters: infer_label(parameters["spec"]))
def rollout(settings: Settings, spec: InferSpec, parent_run_id: str | None = None) -> dict:
    logger = get_run_logger()
    plan = plan_rollout(settings, spec, logger)
    model_run_id, dataset = plan.model_run_id, plan.dataset
    tags = {Tag.DEVICE: spec.device, Tag.MODE: spec.mode, Tag.WORKERS: str(spec.workers), Tag.MODEL_RUN: model_run_id,
            Tag.DATASET: dataset, Tag.FRAMEWORK: plan.framework}
    if spec.cell:
        tags[Tag.CELL] = spec.cell
    name = infer_run_name(spec, plan.framework)
    how = "the whole frame on one worker" if spec.mode == "full" else f"map-reduce tiles over {spec.workers} workers"
    description = (f"Rollout of {spec.steps} steps of the generator of training run {model_run_id} on {spec.device}, {how}, "
                   f"against the solver's frames of dataset `{dataset}` (simulation {plan.simulation}). "
                   "Per-step errors are logged against the rollout step; horizons count steps within the thresholds.")
    with mlflow_run(settings, "infer", name, params=spec.model_dump(exclude={"cell"}), tags=tags, parent_run_id=parent_run_id,
                    description=description) as run:
        dataset_dir = settings.dataset_dir(dataset)
        run.log_dataset(dataset, load_manifest(dataset_dir)["digest"], dataset_dir, "evaluation")
        logger.info("MLflow run: %s", run_url(settings, run.run_id))
        job = {"plan": plan.to_json(), "settings": settings.model_dump(mode="json"), "run_id": run.run_id}
        result = run_child("rollout", plan.body, job, logger, env=device_env(spec.device, spec.workers, plan.framework), framework=plan.framework)
    return {**result, "run_id": run.run_id, "model_run_id": model_run_id}
