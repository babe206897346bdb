"""The pipeline's Prefect flows: generate, train, infer, aggregate, and the demo that chains them."""

from prefect import flow

from tasks.aggregate import aggregate_runs
from tasks.generate import run_sweep
from tasks.infer import rollout
from tasks.settings import Settings
from tasks.specs import AggregateSpec, DemoSpec, GenerateSpec, InferSpec, TrainSpec, ValidateSpec
from tasks.train import train_model
from tasks.validation import validate_solver as run_validation


def _settings() -> Settings:
    return Settings.from_env().require_writable()


@flow(name="generate", log_prints=False)
def generate(spec: GenerateSpec = GenerateSpec()) -> dict:
    """Simulate a parameter sweep of channel flows into a zarr dataset (skips finished simulations)."""
    return run_sweep(_settings(), spec)


@flow(name="train")
def train(spec: TrainSpec = TrainSpec()) -> dict:
    """Train Pix2Pix on a dataset on the chosen device."""
    return train_model(_settings(), spec)


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
