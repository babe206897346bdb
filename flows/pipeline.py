"""The pipeline's Prefect flows: generate, train, infer, aggregate, and the demo that chains them."""

from prefect import flow, get_run_logger

from tasks.aggregate import aggregate_runs
from tasks.generate import run_sweep
from tasks.infer import rollout
from tasks.settings import Settings
from tasks.specs import AggregateSpec, DemoSpec, GenerateSpec, InferSpec, TrainSpec, ValidateSpec
from tasks.train import check_training_input, log_study_table, plan_world, probe_device, resume_plan, sweep_run, train_model
from tasks.validation import validate_solver as run_validation


def _settings() -> Settings:
    return Settings.from_env().require_writable()


@flow(name="generate", log_prints=False)
def generate(spec: GenerateSpec = GenerateSpec()) -> dict:
    """Simulate a parameter sweep of channel flows into a zarr dataset (skips finished simulations)."""
    return run_sweep(_settings(), spec)


@flow(name="train")
def train(spec: TrainSpec = TrainSpec()) -> dict:
    """Train Pix2Pix on a dataset on the chosen device: one run per batch size (several make a sweep,
    whose runs are children of one parent run holding the study's table), or resume an interrupted run."""
    settings = _settings()
    resume_id = spec.resume
    if resume_id:
        spec, batch_sizes = resume_plan(settings, spec)
        batch_sizes = [batch_sizes]
    else:
        batch_sizes = spec.batch_sizes
    probed = probe_device(spec.device, spec.world_size) if spec.device != "cpu" else None
    world, procs = plan_world(spec, probed)
    check_training_input(settings, spec, batch_sizes, world)
    if len(batch_sizes) == 1:
        result = train_model(settings, spec, batch_sizes[0], world, procs, resume_run_id=resume_id)
        return {**result, "device_kind": spec.device}
    logger = get_run_logger()
    results = []
    with sweep_run(settings, spec) as parent:
        for b in batch_sizes:
            state = train_model(settings, spec, b, world, procs, parent_run_id=parent.run_id, return_state=True)
            if state.is_completed():
                results.append({**state.result(), "device_kind": spec.device, "status": "FINISHED"})
            else:  # one failed configuration (too large a batch, ...) does not stop the sweep
                logger.error("batch size %d failed: %s", b, state.message)
                results.append({"batch_size": b, "device_kind": spec.device, "world_size": world, "status": "FAILED", "error": state.message})
        rows = log_study_table(settings, parent.run_id, results)
        if not any(r["status"] == "FINISHED" for r in results):
            raise RuntimeError(f"every configuration of the sweep failed; first: {results[0].get('error')}")
    return {"parent_run_id": parent.run_id, "runs": results, "table": rows,
            "run_id": next(r["run_id"] for r in reversed(results) if r["status"] == "FINISHED")}


@flow(name="infer")
def infer(spec: InferSpec = InferSpec()) -> dict:
    """Roll a trained generator out on a held-out simulation and score it against the solver."""
    return rollout(_settings(), spec)


@flow(name="aggregate")
def aggregate(spec: AggregateSpec = AggregateSpec()) -> dict:
    """Build comparison tables, figures and a report from the experiment's runs."""
    return aggregate_runs(_settings(), spec)


@flow(name="validate-solver")
def validate_solver(spec: ValidateSpec = ValidateSpec()) -> dict:
    """Check the solver against the Schäfer-Turek cylinder benchmark over a ladder of resolutions."""
    return run_validation(_settings(), spec)


@flow(name="demo")
def demo(spec: DemoSpec = DemoSpec()) -> dict:
    """The quick CPU pipeline: simulate, train, roll out, report; every stage logged to MLflow."""
    settings = _settings()
    data = generate(spec.generate)
    trained = train(spec.train)
    inferred = infer(spec.infer.model_copy(update={"model_run": trained["run_id"]}))
    report = aggregate(spec.aggregate)
    return {
        "tracking_uri": settings.tracking_uri,
        "experiment": settings.experiment,
        "runs": {"generate": data["run_id"], "train": trained["run_id"], "infer": inferred["run_id"], "aggregate": report["run_id"]},
        "dataset": {"name": data["dataset"], "digest": data["digest"], "path": data["path"], "simulations": len(data["simulations"])},
        "report": report["report"],
    }
