"""Prefect tasks (flow process): one planned training run in its own child process(es), tracked as one MLflow run; a batch-size sweep as a parent run with the study's table."""

import contextlib

from prefect import get_run_logger, task

from tasks.common.process import events
from tasks.common.process.launch import run_child
from tasks.common.tracking.names import Tag, sweep_run_name, train_label, train_run_name
from tasks.common.process.progress import Progress
from tasks.common.records import TrainRecord
from tasks.common.config.frameworks import FRAMEWORKS
from tasks.common.config.settings import Settings
from tasks.common.specs import TrainSpec
from tasks.common.stores.store import write_json_atomic, writer_lock
from tasks.common.reports.tables import markdown_table
from tasks.common.tracking.runs import client_for, mlflow_run, run_url
from tasks.train.plan import JOB_FILE, TrainJob, TrainPlan
from tasks.workloads import get_workload

BODY = "tasks.train.job:run_training"  # the training job's body, run in the child

def _budget_words(spec: TrainSpec) -> str:
    if spec.time_budget is not None:
        return f"{spec.time_budget:g} s of training" + (f" (at most {spec.epochs} epochs)" if spec.epochs else "")
    return f"{spec.epoch_limit} epochs" + (f" (at most {spec.max_steps} steps)" if spec.max_steps else "")


def headline(metrics: dict, currency: str) -> str:
    """A finished training run's results in one bold line, the first of its MLflow description: samples/s, time to the
    target (or that it was not reached), its test scores, the share of the measured ceiling, energy and cost, each where logged."""
    def number(x: float) -> str:
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"

    parts = [f"{number(metrics['samples_per_s'])} samples/s"] if "samples_per_s" in metrics else []
    if metrics.get("target_reached") == 1.0 and "time_to_target_s" in metrics:
        parts.append(f"target in {number(metrics['time_to_target_s'])} s")
    elif "target_reached" in metrics:
        parts.append("target not reached")
    parts += [f"{k.removeprefix('test_').replace('_', ' ')} {number(v)}" for k, v in sorted(metrics.items())
              if k.startswith("test_") and "loss" not in k]
    if "mfu_ceiling" in metrics:
        parts.append(f"{100 * metrics['mfu_ceiling']:.3g} % of the measured ceiling")
    if "energy_j" in metrics:
        parts.append(f"{number(metrics['energy_j'])} J")
    if "cost" in metrics:
        parts.append(f"{metrics['cost']:.3g} {currency}")
    return f"**{' · '.join(parts)}**" if parts else ""


def training_tags(spec: TrainSpec, batch_size: int, digest: str) -> dict[str, str]:
    """The MLflow tags users filter training runs on."""
    tags = {Tag.WORKLOAD: spec.workload, Tag.FRAMEWORK: spec.framework, Tag.DEVICE: spec.device, Tag.BATCH_SIZE: str(batch_size),
            Tag.DATASET: spec.dataset, Tag.DATASET_DIGEST: digest, **spec.options.tags()}
    if spec.cell:
        tags[Tag.CELL] = spec.cell
    return tags


@task(name="train-model", task_run_name=lambda parameters: train_label(parameters["plan"].spec, [parameters["batch_size"]]))
def train_model(settings: Settings, plan: TrainPlan, batch_size: int, parent_run_id: str | None = None) -> dict:
    """Train the plan's workload at one batch size in child process(es); returns its summary.
    The run's progress (the child's progress events) is a Prefect progress artifact of this task run."""
    logger = get_run_logger()
    spec, world, resume_run_id = plan.spec, plan.world, plan.resume
    dataset_dir = settings.dataset_dir(spec.dataset)
    workload = get_workload(spec.workload)
    digest, profile = workload.dataset_info(settings, spec.dataset)
    name = train_run_name(spec, batch_size)
    description = (f"{workload.title}, {workload.setting(spec)}, trained with {spec.framework} on dataset `{spec.dataset}` ({', '.join(f'{v} {k}' for k, v in profile.items())}) on {spec.device} x{world}{f' ({plan.strategy} strategy)' if len(FRAMEWORKS[spec.framework].strategies) > 1 else ''}, global batch {batch_size}, {spec.precision}, for {_budget_words(spec)}, seed {spec.seed}. "
                   "Metrics: epoch_time_s per epoch; time_per_epoch_s is the median whole epoch without the first (warm-up), samples_per_s "
                   "the samples per second at it (where a limit cut the epochs short, their samples over their time); "
                   "val_* are validation scores, logged against epochs; record.json holds the run's configuration and summary.")
    # batch_size, world_size and strategy are logged by the run itself, as they resolved
    params = None if resume_run_id else {k: v for k, v in spec.params().items() if k not in {"batch_sizes", "world_size", "strategy"}}
    with contextlib.ExitStack() as held:
        if resume_run_id:  # one writer per run: taken before the run is reopened, so a refused second resume changes nothing
            held.enter_context(writer_lock(settings.run_dir(resume_run_id), f"run {resume_run_id}"))
        run = held.enter_context(mlflow_run(settings, "train", name, params=params, tags=training_tags(spec, batch_size, digest),
                                            parent_run_id=parent_run_id, reopen=resume_run_id, description=description))
        run_dir = settings.run_dir(run.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        if not resume_run_id:
            held.enter_context(writer_lock(run_dir, f"run {run.run_id}"))
            run.log_dataset(spec.dataset, digest, dataset_dir, "training", profile)
        job = TrainJob(plan=plan, settings=settings, run_id=run.run_id, batch_size=batch_size).model_dump(mode="json")
        if not resume_run_id:  # what the child receives, kept for --resume
            write_json_atomic(run_dir / JOB_FILE, job)
        logger.info("MLflow run: %s", run_url(settings, run.run_id))
        progress = Progress(f"training {name}: share of the epochs or time budget done")

        def on_event(event: dict) -> None:
            if event[events.KEY] == events.PROGRESS:
                progress.update(event["fraction"])

        record = TrainRecord.model_validate(run_child("train", BODY, job, logger, env=plan.child_env(), procs=plan.procs, on_event=on_event,
                                                      framework=plan.framework, hosts=plan.hosts))
        progress.update(1.0)
        note = run.client.get_run(run.run_id).data.tags.get(Tag.DESCRIPTION, "")
        run.set_tags({Tag.DESCRIPTION: f"{headline(record.mlflow_metrics(), settings.currency)}\n\n{note}".strip()})
    config = record.config
    return {**record.mlflow_metrics(), "split": config.split, "device": config.device_name, "world_size": config.world_size,
            "strategy": config.strategy, "run_id": run.run_id, "batch_size": batch_size}


def study_table(results: list[dict]) -> list[dict]:
    """The study's table from training results (one dict per configuration, as train_model returns
    or as read back from MLflow): device, batch size, world size, status, time per epoch, samples/s,
    and speedup = slowest finished time per epoch / this one. Failed configurations stay in the
    table with their status."""
    rows = []
    for r in results:
        finished = r.get("status", "FINISHED") == "FINISHED" and "time_per_epoch_s" in r
        rows.append({"run": str(r.get("run_id", ""))[:8], "device": str(r.get("device_kind", r.get("device", "?"))),
                     "batch_size": int(r.get("batch_size", 0)), "world_size": int(r.get("world_size", 1)),
                     "status": "FINISHED" if finished else r.get("status", "FAILED"),
                     "time_per_epoch_s": float(r["time_per_epoch_s"]) if finished else float("nan"),
                     "samples_per_s": float(r.get("samples_per_s", float("nan"))) if finished else float("nan"),
                     "final_l1": float(r.get("final_l1", float("nan"))) if finished else float("nan")})
    done = [r["time_per_epoch_s"] for r in rows if r["status"] == "FINISHED"]
    slowest = max(done) if done else float("nan")
    for r in rows:
        r["speedup"] = slowest / r["time_per_epoch_s"] if r["status"] == "FINISHED" else float("nan")
    return sorted(rows, key=lambda r: (r["device"], r["batch_size"], r["run"]))


@task(name="log-study-table")
def log_study_table(settings: Settings, parent_run_id: str, results: list[dict]) -> list[dict]:
    """The sweep's table (batch size x device -> time per epoch, samples/s, speedup) in the parent run."""
    rows = study_table(results)
    client = client_for(settings)
    client.log_text(parent_run_id, markdown_table(rows), "study_table.md")
    client.log_dict(parent_run_id, rows, "study_table.json")
    for r in rows:
        if r["status"] == "FINISHED":
            b = r["batch_size"]
            client.log_metric(parent_run_id, f"time_per_epoch_s_b{b}", r["time_per_epoch_s"])
            client.log_metric(parent_run_id, f"samples_per_s_b{b}", r["samples_per_s"])
    return rows


def sweep_run(settings: Settings, spec: TrainSpec, parent_run_id: str | None = None):
    """The parent MLflow run of a batch-size sweep (a context manager; see tasks.common.tracking.runs.mlflow_run)."""
    digest, _ = get_workload(spec.workload).dataset_info(settings, spec.dataset)
    sizes = ",".join(map(str, spec.batch_sizes))
    return mlflow_run(settings, "train-sweep", sweep_run_name(spec), params=spec.params(),
                      tags={Tag.DEVICE: spec.device, Tag.DATASET: spec.dataset, Tag.DATASET_DIGEST: digest},
                      parent_run_id=parent_run_id,
                      description=f"Batch-size sweep ({sizes}) on {spec.device}: one child run per batch size; study_table.md compares them "
                                  "(the same settings apart from the batch size).")


@task(name="register-champion", task_run_name="register champion", retries=2, retry_delay_seconds=[2, 5])
def register_surrogate(settings: Settings, workload: str, run_ids: list[str]) -> dict:
    """The best of a benchmark's training runs of ``workload`` registered as a version of the settings' registered model, the alias
    ``champion`` moved to it where it beats the current one (the workload's ``register``: karman's compares runs on the same
    dataset digest and target)."""
    result = get_workload(workload).register(settings, run_ids)
    if result["version"] is None:
        get_run_logger().info("%s", result["reason"])  # it says that no model was registered, and why
    else:
        get_run_logger().info("registered %s version %d (run %s, %s): %s; %s", result["name"], result["version"], result["run_id"],
                              result["score"], "now the champion" if result["champion"] else "not the champion", result["reason"])
    return result
