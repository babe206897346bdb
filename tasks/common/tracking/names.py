"""The names users filter and find runs by, each made once: MLflow tag names and the runs' names in MLflow and Prefect (no MLflow import, so any process may use them)."""

from tasks.common.config.frameworks import DEFAULT


class Tag:
    """``karman.*`` run tags; experiment-level ones are in tasks.common.tracking.runs."""

    STAGE = "karman.stage"  # generate, train, train-sweep, infer, aggregate, benchmark, demo, ablation, validate, ceiling
    WORKLOAD = "karman.workload"  # the workload a run trains or evaluates (tasks.workloads' table)
    CELL = "karman.cell"  # the benchmark cell a run belongs to (a key of its inputs and dataset digest)
    BENCHMARK = "karman.benchmark"  # on a benchmark's own run: its name
    CELLS = "karman.cells"  # on a benchmark's own run: how many cells it has
    CHAMPION = "karman.champion"  # on a benchmark's own run: the model version it registered, and whether it is the champion
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
    LEARNED_NOTHING = "karman.learned_nothing"  # why a finished run's test scores show it learned nothing (workload.learned_nothing)
    TIME_TO_TRAIN = "karman.time_to_train"  # set on a resumed run: its time to target is no time-to-train (the report leaves it out)
    MLPERF = "karman.mlperf"  # whether the run's MLPerf-format log (artifact mlperf/mllog.txt) passes MLCommons' compliance checker
    ERROR = "karman.error"  # on a failed run: the reason, in one line
    VALIDATION_WITHIN_2PCT = "karman.validation.within_2pct"
    VALIDATION_INSIDE = "karman.validation.inside"
    DRIVER = "karman.driver"  # host:pid:start of the process that holds the run open (for reaping)
    DESCRIPTION = "mlflow.note.content"  # the run's description in the MLflow UI
    # The Prefect flow run that opened the run (or last reopened it: a resume), on every run opened in one
    FLOW_RUN_ID = "prefect.flow_run_id"
    FLOW_RUN_URL = "prefect.flow_run_url"  # its page in the Prefect UI, where a server is configured


# Run names, made here only: MLflow's (``digits-torch-cpu-b8``) and Prefect's flow and task runs' (``train digits
# torch cpu b8``) for the same run say the same things: what ran (workload, framework), where (device), at what batch,
# and whatever else a benchmark varies (the seed, the workload's options' part: har's layers and units), so that no two runs of one benchmark share
# a name. ``spec`` is a TrainSpec or an InferSpec (duck-typed, so that any process may import this module without
# pydantic models).

def _training(spec, sizes: str) -> list[str]:
    """The parts of a training run's name: workload, framework, device, batch(es), then what is set away from the default."""
    return [spec.workload, spec.framework, spec.device, f"b{sizes}", spec.options.name_part(), f"s{spec.seed}" if spec.seed else ""]


def train_run_name(spec, batch_size: int) -> str:
    """The MLflow run name of one training run: ``digits-torch-cpu-b8``, ``har-jax-cpu-b64-l1u16-s2``."""
    return "-".join(filter(None, _training(spec, str(batch_size))))


def sweep_run_name(spec) -> str:
    """The MLflow run name of a batch-size sweep's parent run: ``sweep-karman-torch-cpu-b8,16``."""
    return "-".join(filter(None, ["sweep", *_training(spec, ",".join(map(str, spec.batch_sizes)))]))


def infer_run_name(spec, framework: str = DEFAULT) -> str:
    """The MLflow run name of one rollout of a model trained in ``framework``: ``infer-torch-mapreduce-cpu-w2``."""
    return f"infer-{framework}-{spec.mode}-{spec.device}-w{spec.workers}"


def train_label(spec, batch_sizes: list[int] | None = None) -> str:
    """A training run's name in Prefect: ``train digits torch cpu b8``, ``train karman tensorflow cuda b8,16 s1``;
    ``batch_sizes`` (default: the spec's) names one run of a sweep. A request to resume names the run it resumes
    (``train resume 0123abcd``): its workload, framework, device and batch are the stored run's, not the request's defaults."""
    if spec.resume:
        return f"train resume {spec.resume[:8]}"
    return " ".join(filter(None, ["train", *_training(spec, ",".join(map(str, batch_sizes or spec.batch_sizes)))]))


def infer_label(spec) -> str:
    """A rollout's name in Prefect: ``infer mapreduce cpu x2``, and the model's run where the request names one by its id
    (``infer mapreduce cpu x2 model 0123abcd``: a benchmark rolls out one model per framework in every cell)."""
    model = f" model {spec.model_run[:8]}" if len(spec.model_run) == 32 and spec.model_run.isalnum() else ""
    return f"infer {spec.mode} {spec.device} x{spec.workers}{model}"
