"""The MLflow tag names users filter and group runs on, defined once (no MLflow import, so any process may use them)."""


class Tag:
    """``karman.*`` run tags; experiment-level ones are in tasks.common.tracking."""

    STAGE = "karman.stage"  # generate, train, train-sweep, infer, aggregate, benchmark, demo, ablation, validate
    WORKLOAD = "karman.workload"  # the workload a run trains or evaluates (tasks.workloads' table)
    CELL = "karman.cell"  # the benchmark cell a run belongs to (a key of its inputs and dataset digest)
    BENCHMARK = "karman.benchmark"  # on a benchmark's own run: its name
    CELLS = "karman.cells"  # on a benchmark's own run: how many cells it has
    DEVICE = "karman.device"
    DEVICES = "karman.devices"  # on a benchmark's own run: the devices it compares
    BATCH_SIZE = "karman.batch_size"
    MODE = "karman.mode"
    WORKERS = "karman.workers"
    FRAMEWORK = "karman.framework"
    RECIPE = "karman.recipe"
    DATASET = "karman.dataset"
    DATASET_DIGEST = "karman.dataset_digest"
    MODEL_RUN = "karman.model_run"  # on a rollout: the training run whose generator it rolls out
    MODEL_URI = "karman.model_uri"  # on a training run: the logged generator's URI
    TARGET = "karman.target"
    ERROR = "karman.error"  # on a failed run: the reason, in one line
    VALIDATION_WITHIN_2PCT = "karman.validation.within_2pct"
    VALIDATION_INSIDE = "karman.validation.inside"
    DRIVER = "karman.driver"  # host:pid:start of the process that holds the run open (for reaping)
    DESCRIPTION = "mlflow.note.content"  # the run's description in the MLflow UI
