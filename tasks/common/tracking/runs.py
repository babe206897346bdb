"""MLflow behind one context manager: every run is opened, tagged and closed here."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import psutil

from tasks.common.tracking.flowrun import flow_run_link, running_flow_run
from tasks.common.tracking.names import Tag
from tasks.common.config.settings import Settings

if TYPE_CHECKING:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

# MLflow (over a second to import) is imported where it is used: a command refused for bad input before it
# talks to its store does not load it.

log = logging.getLogger(__name__)


def _flatten(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:6000]
    return out


# The experiment's kind, for MLflow's experiment list and other clients. MLflow 3.17's UI chooses its
# view per browser instead; the project's server sets that choice (infra/mlflow_server.py).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development",
                   Tag.DESCRIPTION: "Kármán Bench: neural surrogates of a vortex street, trained and rolled out "
                                          "across devices, frameworks and batch sizes, against a lattice-Boltzmann solver."}


def tracking_ready(settings: Settings, timeout_s: float = 5.0, create: bool = True) -> None:
    """Fail fast, before any work, if the tracking store cannot be used: a server that does not answer its
    health check within ``timeout_s`` (UserError naming the URI). With ``create``, a local SQLite store
    is opened, its tables created under a file lock so that two commands never race on them."""
    from tasks.common.config.errors import UserError

    uri = settings.tracking_uri
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as response:
                response.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UserError(f"the MLflow tracking server {uri} does not answer ({reason}); start it (infra/start-mlflow-server.sh) "
                            "or set MLFLOW_TRACKING_URI to one that runs") from None
        _check_credentials(uri, timeout_s)
    elif (db := sqlite_file(settings)) is not None and create:
        db.parent.mkdir(parents=True, exist_ok=True)
        with open(db.with_name(db.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one creator of the tables at a time
            client_for(settings).search_experiments(max_results=1)


def _check_credentials(uri: str, timeout_s: float) -> None:
    """UserError (one line) if the tracking server refuses this process's credentials, or asks for some
    and it has none; a server without authentication takes any request."""
    from tasks.common.tracking.credentials import MLFLOW_FILE_ENV, MLFLOW_PASSWORD_ENV, MLFLOW_USER_ENV, auth_refused
    from tasks.common.config.errors import UserError

    user, password = os.environ.get(MLFLOW_USER_ENV), os.environ.get(MLFLOW_PASSWORD_ENV)
    auth = f"{user}:{password}" if user and password else None
    code = auth_refused(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1", auth, timeout_s)
    if code:
        given = f"refuses the user {user!r}" if auth else "asks for a user and password"
        raise UserError(f"the MLflow tracking server {uri} {given} (HTTP {code}); set {MLFLOW_USER_ENV} and "
                        f"{MLFLOW_PASSWORD_ENV}, or {MLFLOW_FILE_ENV}, to an account of that server")


def experiment_id(client: MlflowClient, settings: Settings) -> str:
    """The experiment's id, creating it (artifacts under the artifact root for local stores) if needed;
    it is marked as a model-training experiment, so the MLflow UI opens on its runs."""
    exp = client.get_experiment_by_name(settings.experiment)
    if exp is not None:
        if "mlflow.experimentKind" not in exp.tags:
            for key, value in EXPERIMENT_KIND.items():
                client.set_experiment_tag(exp.experiment_id, key, value)
        return exp.experiment_id
    location = None
    if not settings.tracking_uri.startswith(("http://", "https://", "databricks")):
        location = settings.artifact_root.as_uri()
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(settings.experiment, artifact_location=location, tags=EXPERIMENT_KIND)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(settings.experiment).experiment_id  # another command created it a moment before


LOCAL_MLFLOW_UI = "http://127.0.0.1:5000"  # where `mlflow ui --backend-store-uri URI` serves a local store by default


def mlflow_ui_url(settings: Settings, run_id: str, exp_id: str) -> tuple[str, str]:
    """(the run's page in the MLflow UI, how to open it): the tracking server's page, or for a local store
    the page that ``mlflow ui`` serves once started on it."""
    if settings.tracking_uri.startswith(("http://", "https://")):
        return run_url(settings, run_id, exp_id), f"on the tracking server {settings.tracking_uri}"
    page = f"{LOCAL_MLFLOW_UI}/#/experiments/{exp_id}/runs/{run_id}?workflowType=machine_learning"
    return page, f"in the local store {settings.tracking_uri}: start `mlflow ui --backend-store-uri {settings.tracking_uri}` to open it"


def link_flow_run(settings: Settings, run_id: str, exp_id: str, name: str, stage: str) -> None:
    """A link artifact on the running Prefect flow run (and task run) to the MLflow run ``run_id``; nothing
    outside a flow process. A failure to create it is logged, never raised: the run matters more."""
    if running_flow_run() is None:
        return
    from prefect.artifacts import create_link_artifact

    page, where = mlflow_ui_url(settings, run_id, exp_id)
    key = "mlflow-" + re.sub(r"[^a-z0-9-]+", "-", stage.lower()).strip("-")
    try:
        create_link_artifact(link=page, link_text=f"MLflow run {name}", key=key,
                             description=f"The MLflow run `{name}` ({run_id}) of this flow run, experiment {settings.experiment}, {where}.")
    except Exception as exc:
        log.warning("link to MLflow run %s not added to the Prefect flow run: %s", run_id, exc)


def run_url(settings: Settings, run_id: str, exp_id: str | None = None) -> str:
    """Where a user finds the run: its page on an MLflow server, else its id in the local store."""
    if settings.tracking_uri.startswith(("http://", "https://")):
        if exp_id is None:
            exp_id = client_for(settings).get_run(run_id).info.experiment_id
        # a plain `mlflow server` opens a new browser in its GenAI view unless the link says otherwise
        return f"{settings.tracking_uri.rstrip('/')}/#/experiments/{exp_id}/runs/{run_id}?workflowType=machine_learning"
    return f"{run_id} in {settings.tracking_uri}"


class Run:
    """A handle on an open MLflow run."""

    def __init__(self, client: MlflowClient, run_id: str):
        self.client, self.run_id = client, run_id

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        self.log_step_metrics([(step, metrics)])

    def log_step_metrics(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Several steps' metrics in one request per 500 values: rows of (step, {name: value})."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for step, values in rows for k, v in values.items()]
        for i in range(0, len(batch), 500):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 500])

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        flat = [Param(k, v) for k, v in _flatten(params).items()]
        for i in range(0, len(flat), 100):
            self.client.log_batch(self.run_id, params=flat[i : i + 100])

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_dataset(self, name: str, digest: str, source: Path, context: str, profile: dict | None = None) -> None:
        """The zarr dataset as one of the run's MLflow dataset inputs (the runs table's Dataset column):
        its name, digest and folder, ``context`` 'training' or 'evaluation'."""
        import json

        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(name=name, digest=digest[:36], source_type="local", source=json.dumps({"uri": Path(source).resolve().as_uri()}),
                          profile=json.dumps(profile) if profile else None)
        self.client.log_inputs(self.run_id, datasets=[DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])])

    def log_dict(self, value: dict, name: str) -> None:
        """``value`` as the JSON artifact ``name`` (replacing an earlier one of that name)."""
        self.client.log_dict(self.run_id, value, name)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if Path(path).is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)


def code_version() -> str:
    """What code ran: the git commit (with '+dirty' for local changes) where the sources are a
    checkout, and always a digest of the Python sources themselves ('src:...')."""
    import hashlib
    import subprocess

    root = Path(__file__).resolve().parents[3]
    digest = hashlib.sha256()
    for path in sorted(p for folder in ("models", "tasks", "flows") for p in (root / folder).rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    version = f"src:{digest.hexdigest()[:12]}"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return version
    if commit.returncode == 0:
        version = f"git:{commit.stdout.strip()}{'+dirty' if dirty.stdout.strip() else ''} {version}"
    return version


def training_run(settings: Settings, run_id: str, label: str = "run"):
    """The MLflow run ``run_id``; UserError if the store does not know it or it is not a training run."""
    from mlflow.exceptions import MlflowException

    from tasks.common.config.errors import UserError

    unknown = f"unknown {label} {run_id!r} in the tracking store {settings.tracking_uri}"
    if store_not_made(settings):
        raise UserError(unknown)
    try:
        run = client_for(settings).get_run(run_id)
    except MlflowException as exc:
        if not missing(exc):
            raise
        raise UserError(unknown) from None
    if run.data.tags.get(Tag.STAGE) != "train":
        raise UserError(f"run {run_id!r} is not a training run (stage {run.data.tags.get(Tag.STAGE)!r})")
    return run


def missing(exc: MlflowException) -> bool:
    """Whether MLflow refused a request because what it names (a run, an artifact) does not exist or
    cannot be an id at all, rather than because the store failed."""
    return exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def sqlite_file(settings: Settings) -> Path | None:
    """The file of a local SQLite tracking store (``sqlite:///PATH``); None for any other store."""
    uri = settings.tracking_uri
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def store_not_made(settings: Settings) -> bool:
    """Whether the tracking store is a local SQLite file that does not exist yet: nothing is in it, and opening it to look
    would make it (a lookup that finds nothing is refused without leaving a store behind)."""
    db = sqlite_file(settings)
    return db is not None and not db.exists()


def client_for(settings: Settings) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=settings.tracking_uri)


@contextlib.contextmanager
def mlflow_run(
    settings: Settings,
    stage: str,
    name: str,
    params: dict[str, Any] | None = None,
    tags: dict[str, Any] | None = None,
    parent_run_id: str | None = None,
    reopen: str | None = None,
    description: str | None = None,
) -> Iterator[Run]:
    """Open a run of ``stage`` in the settings' experiment (or ``reopen`` an existing one, to resume
    it), with ``description`` as its note in the MLflow UI; it ends FINISHED, KILLED when stopped by a signal, or
    FAILED on any other exception. Opened for a Prefect flow run (in its process, or in a child job of it),
    the run carries the flow run's id and page as tags and a link in its note, and the flow run gets a
    link artifact to the MLflow run."""
    client = client_for(settings)
    link = flow_run_link()
    tags = {**(tags or {}), Tag.DRIVER: driver_id(), **(link.tags() if link else {})}
    if description or link:
        tags[Tag.DESCRIPTION] = "\n\n".join(filter(None, [description, link.markdown() if link else None]))
    if reopen:
        client.update_run(reopen, status="RUNNING")
        handle = Run(client, reopen)
        handle.set_tags(tags)
        exp_id = client.get_run(reopen).info.experiment_id
    else:
        run_tags = {Tag.STAGE: stage, **(tags or {})}
        if parent_run_id:
            run_tags["mlflow.parentRunId"] = parent_run_id
        exp_id = experiment_id(client, settings)
        run = client.create_run(exp_id, run_name=name, tags={k: str(v) for k, v in run_tags.items()})
        handle = Run(client, run.info.run_id)
    if link:
        link_flow_run(settings, handle.run_id, exp_id, name, stage)
    try:
        if params:
            handle.log_params(params)
        yield handle
    except BaseException as exc:
        handle.set_tags({Tag.ERROR: f"{type(exc).__name__}: {exc}"[:5000]})
        client.set_terminated(handle.run_id, "KILLED" if stopped(exc) else "FAILED")
        raise
    else:
        client.set_terminated(handle.run_id, "FINISHED")


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started, in the kernel's clock ticks since boot (as /proc/PID/stat counts it:
    no clock change moves it), or None if there is no such process."""
    try:
        since_boot = psutil.Process(pid).create_time() - psutil.boot_time()
    except psutil.NoSuchProcess:
        return None
    return str(round(since_boot * os.sysconf("SC_CLK_TCK")))


def driver_id(pid: int | None = None) -> str:
    """host:pid:start of a process: who holds a run open; the start time tells a reused pid apart."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid) or '?'}"


def driver_alive(driver: str) -> bool | None:
    """Whether the process named by ``driver_id`` still runs: True or False on this host, None elsewhere."""
    host, _, rest = driver.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    now = _start_time(int(pid))
    return now is not None and (start in ("?", now))


def reap_orphans(settings: Settings, log=None, reason: str | None = None) -> list[str]:
    """Mark KILLED the RUNNING runs of the experiment whose driver on this host is gone (a killed command
    or worker), ``reason`` added to the note of why; runs driven from other hosts are left alone. Returns
    the ids marked."""
    client = client_for(settings)
    marked = []
    for run in client.search_runs([experiment_id(client, settings)], "attributes.status = 'RUNNING'", max_results=500):
        driver = run.data.tags.get(Tag.DRIVER)
        if driver and driver_alive(driver) is False:
            why = f"its driver ({driver.rsplit(':', 1)[0]}) ended without closing it" + (f": {reason}" if reason else "")
            client.set_tag(run.info.run_id, Tag.ERROR, why)
            client.set_terminated(run.info.run_id, "KILLED")
            marked.append(run.info.run_id)
            if log is not None:
                log.warning("run %s was left RUNNING by a process that is gone (%s); marked KILLED", run.info.run_id, driver.rsplit(":", 1)[0])
    return marked


def stopped(exc: BaseException) -> bool:
    """Whether ``exc`` ends a run because it was asked to stop (a signal), not because it failed."""
    from tasks.common.config.errors import Interrupted, RunStopped

    return isinstance(exc, (RunStopped, Interrupted, KeyboardInterrupt)) or type(exc).__name__ == "TerminationSignal"


@contextlib.contextmanager
def system_metrics(settings: Settings, run_id: str, every_s: float, resume: bool = False) -> Iterator[None]:
    """MLflow's sampler of CPU, memory, disk, network (and GPU) as ``system/...`` metrics of the run,
    on a thread while the block runs; a last sample is logged when it ends, so runs shorter than one
    interval get one too."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=every_s, resume_logging=resume, tracking_uri=settings.tracking_uri)
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()
        try:
            monitor.collect_metrics()
            monitor.publish_metrics(monitor.aggregate_metrics())
            monitor.mlflow_logger.flush()
        except Exception as exc:  # the run's own results matter more than its last system sample
            log.warning("last system-metrics sample not logged: %s", exc)
