"""Prefect tasks: one training run in its own child process(es), tracked as one MLflow run; a
batch-size sweep as a parent run with the study's table; resuming an interrupted run."""

import json
import os
import re
import socket

from prefect import get_run_logger, task

from tasks.aggregate import markdown_table, study_table
from tasks.child import device_env, run_child
from tasks.errors import UserError
from tasks.progress import Progress
from tasks.settings import Settings
from tasks.specs import TrainSpec
from tasks.store import load_manifest, write_json_atomic
from tasks.tracking import CELL_TAG, client_for, mlflow_run, run_url, training_run

JOB_FILE = "job.json"  # the run's configuration, kept with its checkpoint for --resume
OWNER_FILE = "owner.json"  # host and pid of the process driving the run


def plan_world(spec: TrainSpec, probed: dict | None) -> tuple[int, int]:
    """(world size, processes to launch) for the spec on this host; UserError if the host lacks them.
    ``probed`` is the device probe's answer (None for cpu)."""
    if spec.device == "cpu":
        world = spec.world_size or 1
        cores = os.cpu_count() or 1
        if world > cores:
            raise UserError(f"world size {world} exceeds the {cores} CPU cores of this host")
        return world, world
    available = int(probed["world_size"]) if probed else 1
    world = spec.world_size or available
    if world > available:
        raise UserError(f"world size {world} exceeds the {available} {spec.device} devices of this host ({probed['device']})")
    if spec.device == "xla" and world != available:
        raise UserError(f"xla trains over all {available} devices of the host with SPMD; leave out --world-size or set it to {available}")
    return world, (world if spec.device == "cuda" else 1)


def check_training_input(settings: Settings, spec: TrainSpec, batch_sizes: list[int], world: int) -> None:
    """What can be refused before any run starts (reads the dataset's metadata only): the frames must
    fit the U-Net, and each batch must split over the devices and fit in the training pairs."""
    from tasks.data import PairSource, split_of, training_net

    dataset_dir = settings.dataset_dir(spec.dataset)
    manifest = load_manifest(dataset_dir)
    split = split_of(manifest, spec.val_simulations, spec.test_simulations, spec.seed)
    source = PairSource(dataset_dir, split["train"], spec.frame_stride, unroll=spec.resolved_recipe().unroll)
    training_net(source.height, source.width, spec.crop, spec.depth)
    for b in batch_sizes:
        if b % world:
            raise UserError(f"batch size {b} does not split evenly over {world} devices; use a multiple of {world}")
        if b > len(source):
            raise UserError(f"batch size {b} exceeds the {len(source)} training pairs of dataset {spec.dataset!r}")


def _child_env(spec: TrainSpec, world: int, procs: int) -> dict[str, str]:
    env = device_env(spec.device, world)
    if spec.device == "cpu":  # share the cores among the ranks; set always, so that a value this process
        # inherited (Dask's LocalCluster sets them to 1 where it starts) cannot starve the run
        threads = str(spec.threads or max(1, (os.cpu_count() or 1) // procs))
        env |= {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}  # torch reads both; MKL's wins
    return env


def _claim(run_dir, run_id: str) -> None:
    """Record this process as the run's driver; refuse if another live process on this host drives it."""
    owner = run_dir / OWNER_FILE
    if owner.exists():
        try:
            prev = json.loads(owner.read_text())
        except (OSError, ValueError):
            prev = {}
        if prev.get("host") == socket.gethostname() and prev.get("pid") not in (None, os.getpid()) and _alive(prev["pid"]):
            raise UserError(f"run {run_id} is being trained by process {prev['pid']} on this host; stop it before resuming")
    write_json_atomic(owner, {"host": socket.gethostname(), "pid": os.getpid()})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _budget_words(spec: TrainSpec) -> str:
    if spec.time_budget is not None:
        return f"{spec.time_budget:g} s of training" + (f" (at most {spec.epochs} epochs)" if spec.epochs else "")
    return f"{spec.epoch_limit} epochs" + (f" (at most {spec.max_steps} steps)" if spec.max_steps else "")


def training_tags(spec: TrainSpec, batch_size: int, digest: str) -> dict[str, str]:
    """The MLflow tags users filter training runs on."""
    tags = {"karman.framework": "torch", "karman.device": spec.device, "karman.batch_size": str(batch_size),
            "karman.recipe": spec.resolved_recipe().name, "karman.dataset": spec.dataset, "karman.dataset_digest": digest}
    if spec.cell:
        tags[CELL_TAG] = spec.cell
    return tags


EPOCH_LINE = re.compile(r"^epoch \d+: .*; (\d+)% done")


@task(name="train-model", task_run_name="train {spec.device} b{batch_size}")
def train_model(settings: Settings, spec: TrainSpec, batch_size: int, world: int, procs: int,
                parent_run_id: str | None = None, resume_run_id: str | None = None) -> dict:
    """Train Pix2Pix at one batch size in child process(es) for the spec's device; returns its summary.
    The run's progress (the child's epoch lines) is a Prefect progress artifact of this task run."""
    logger = get_run_logger()
    dataset_dir = settings.dataset_dir(spec.dataset)
    manifest = load_manifest(dataset_dir)
    digest = manifest["digest"]
    name = f"train-{spec.device}-b{batch_size}"
    description = (f"Pix2Pix, recipe {spec.resolved_recipe().name}, trained on dataset `{spec.dataset}` ({len(manifest['simulations'])} "
                   f"simulations) on {spec.device} x{world}, global batch {batch_size}, {spec.precision}, for {_budget_words(spec)}, seed {spec.seed}. "
                   "Metrics: epoch_time_s per epoch; time_per_epoch_s is their median without the first epoch (warm-up); "
                   "val_* are validation rollouts, logged against epochs; the generator is under Models.")
    # batch_size and world_size are logged by the run itself, as they resolved
    params = None if resume_run_id else spec.model_dump(exclude={"batch_sizes", "resume", "world_size", "cell"})
    with mlflow_run(settings, "train", name, params=params, tags=training_tags(spec, batch_size, digest), parent_run_id=parent_run_id,
                    reopen=resume_run_id, description=description) as run:
        if not resume_run_id:
            run.log_dataset(spec.dataset, digest, dataset_dir, "training", {"simulations": len(manifest["simulations"])})
        run_dir = settings.run_dir(run.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        _claim(run_dir, run.run_id)
        job = {"spec": spec.model_dump(), "settings": settings.model_dump(mode="json"), "run_id": run.run_id,
               "batch_size": batch_size, "resume": bool(resume_run_id)}
        if not resume_run_id:
            write_json_atomic(run_dir / JOB_FILE, {"spec": job["spec"], "batch_size": batch_size})
        logger.info("MLflow run: %s", run_url(settings, run.run_id))
        progress = Progress(f"training {name}: share of the epochs or time budget done")

        def on_line(line: str) -> None:
            if found := EPOCH_LINE.match(line):
                progress.update(int(found.group(1)) / 100)

        result = run_child("train", job, logger, env=_child_env(spec, world, procs), procs=procs, on_line=on_line)
        progress.update(1.0)
    return {**result, "run_id": run.run_id, "batch_size": batch_size}


def resume_plan(settings: Settings, spec: TrainSpec) -> tuple[TrainSpec, int]:
    """The stored configuration and batch size of the run ``spec.resume``; UserError if it cannot be
    resumed (unknown, finished, not a training run, no job file) or the spec contradicts it."""
    run_id = spec.resume
    run = training_run(settings, run_id)
    if run.info.status == "FINISHED":
        raise UserError(f"run {run_id} already finished; there is nothing to resume")
    job_file = settings.run_dir(run_id) / JOB_FILE
    if not job_file.is_file():
        raise UserError(f"run {run_id} has no {JOB_FILE} under {job_file.parent}; it cannot be resumed")
    from tasks.training import CHECKPOINT, load_checkpoint

    load_checkpoint(settings.run_dir(run_id) / CHECKPOINT, mmap=True)  # fails here, before any flow starts
    stored = json.loads(job_file.read_text())
    stored_spec = TrainSpec(**stored["spec"])
    for name in sorted(spec.model_fields_set - {"resume"}):
        mine, theirs = getattr(spec, name), getattr(stored_spec, name)
        if mine != theirs:
            raise UserError(f"--{name.replace('_', '-')} {mine} differs from the run being resumed ({theirs}); leave it out to use the run's value")
    return stored_spec, int(stored["batch_size"])


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
    """The parent MLflow run of a batch-size sweep (a context manager; see tasks.tracking.mlflow_run)."""
    digest = load_manifest(settings.dataset_dir(spec.dataset))["digest"]
    sizes = ",".join(map(str, spec.batch_sizes))
    return mlflow_run(settings, "train-sweep", f"train-sweep-{spec.device}-b{sizes}", params=spec.model_dump(exclude={"resume"}),
                      tags={"karman.device": spec.device, "karman.dataset": spec.dataset, "karman.dataset_digest": digest},
                      parent_run_id=parent_run_id,
                      description=f"Batch-size sweep ({sizes}) on {spec.device}: one child run per batch size; study_table.md compares them "
                                  "(the same settings apart from the batch size).")


@task(name="probe-device")
def probe_device(device: str, world_size: int | None = None) -> dict:
    """Open the device in a child process: its name and device count; fails fast naming what is missing."""
    return run_child("probe", {"device": device}, get_run_logger(), env=device_env(device, world_size))
