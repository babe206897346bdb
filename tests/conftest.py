"""Shared fixtures: an isolated working folder with its own data root and MLflow store."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tasks.common.config.settings import CEILINGS_ENV

# a test stuck past its timeout where pytest-timeout's signal cannot reach ends its process with every thread's stack
pytest_plugins = ["tests.hang_guard"]

ROOT = Path(__file__).resolve().parent.parent

# The tests' processes share two cores with each other: an OpenMP thread that waits for work sleeps instead of
# spinning on a core another test needs (libgomp spins first by default). Tests check results, not speed.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# numpy's OpenBLAS starts a thread per core at import, which spins for about 0.1 s then and after each product: every
# Python process of the tests (hundreds) paid it, twice the CPU of importing numpy (0.19 s instead of 0.10 s, `/usr/bin/time
# python -c "import numpy"` with and without it). No test times numpy's products; the frameworks' threads are their own.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# The MLflow tracking servers the tests start (the soak's, the deployed benchmark's, the authenticated one's) serve a few
# clients each: one uvicorn worker, in the server's own process, instead of one per core, each importing MLflow (about
# 6 s of CPU a worker on a 2-core host). tests/infra/test_mlflow_server.py checks the product's default without it.
os.environ.setdefault("MLFLOW_WORKERS", "1")


def _jax_compilation_cache() -> None:
    """JAX's persistent compilation cache, one new folder per test session, shared by its pytest processes (xdist's
    workers inherit the folder their controller made) and inherited by every command and job they start: a training
    stopped and resumed, or a network several tests train at the same shapes, compiles its step once in the session
    instead of once per process (a calo JAX step: about 28 s of CPU each time). XLA compiles the same program either
    way; the tests check what it computes, not how long it compiles. A size bound turns on JAX's file lock, so that
    processes reading and writing the folder at once never see half an entry. The product itself keeps no cache: a
    benchmark's cells each pay their own compilation, as a user's first run does. ``KARMAN_TEST_JAX_CACHE=0`` turns it off."""
    import atexit
    import shutil
    import tempfile

    ours, named = os.environ.get("KARMAN_TEST_JAX_CACHE", "1"), os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if ours == "0" or (named is not None and named != ours):
        return  # off, or a cache the user named
    if named == ours and os.path.isdir(ours):
        return  # the folder this session's first pytest process made (and removes at its end)
    folder = tempfile.mkdtemp(prefix="karman-jax-cache-")
    atexit.register(shutil.rmtree, folder, True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["KARMAN_TEST_JAX_CACHE"] = folder
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"  # the default 1 s would leave most of the tests' small steps out
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(8 << 30)  # bounded: entries written and read under JAX's file lock


_jax_compilation_cache()

# torch_xla on the host CPU, as the XLA tests run it. They check what XLA computes, not how fast: XLA's CPU backend
# without its LLVM optimisations compiles a training step in about a third of the time, with the same results.
XLA_FAST_COMPILE = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
XLA_CPU_ENV = {"PJRT_DEVICE": "CPU", **XLA_FAST_COMPILE}
# JAX's children that take one to three steps beside torch's from the same weights (the networks' and the workloads'
# equivalence tests) spend most of their CPU in XLA's compiler, and take the same flag: the Pix2Pix equivalence
# 51 → 32 s of CPU, bench-frameworks' three workloads 70 → 42 s, the same losses within their tolerances. Not the
# calo step: its 3-D convolutions then run slower than the compiler saves (43 → 55 s), nor trainings of many steps.

# The full tier: modules whose tests start servers, run flows end to end or train models for minutes.
# ``make test-fast`` (pytest -m "not full") leaves them out, with the tests marked ``full`` elsewhere;
# ``make test`` (CI) runs everything.
FULL_TIER_MODULES = {"test_deployed.py", "test_end_to_end.py", "test_benchmark_flow.py", "test_pipeline.py", "test_training.py", "test_tensorflow.py",
                     "test_digits_flows.py", "test_har_flows.py", "test_calo_training.py", "test_history.py"}


# The longest modules start first, so that with ``-n 3 --dist loadfile`` (make test) the workers
# end together instead of one still running a long module after the other has finished (longest first,
# each next module to the worker that frees up first). Ordered by measured length; keep it in step.
SLOWEST_FIRST = ["test_training.py", "test_rollout.py", "test_calo_training.py", "test_tensorflow.py", "test_benchmark_flow.py", "test_lifetime.py",
                 "test_deployed.py", "test_har_flows.py", "test_digits_flows.py", "test_generate.py", "test_bench_frameworks.py",
                 "test_end_to_end.py", "test_soak.py", "test_history.py", "test_solver_commands.py", "test_bench_quality.py", "test_cli.py",
                 "test_nets_keras.py", "test_triton_solver.py", "test_pipeline.py", "test_warm.py", "test_calo_workload.py", "test_pull_steps.py", "test_jax.py",
                 "test_nets_jax.py", "test_sweep_tasks.py", "test_mlflow_server.py", "test_convergence_runs.py", "test_toy_workload.py",
                 "test_benchmark.py", "test_server_auth.py", "test_har_workload.py", "test_lanes.py", "test_slurm_cluster.py",
                 "test_digits_workload.py", "test_solver.py", "test_bench_matmul.py", "test_nets.py", "test_wheelhouse.py",
                 "test_workload_options.py", "test_aggregate.py", "test_previous_version.py"]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in FULL_TIER_MODULES:
            item.add_marker(pytest.mark.full)
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the order within a module stays


_store_template: list[Path] = []


def _new_store(path: Path) -> None:
    """A new, empty SQLite tracking store at ``path``: a copy of one whose tables this test process created
    once. (The first command to open a new store runs MLflow's schema migrations, about 1 s of CPU more than
    opening an existing one; every test folder would pay it. tests/flows/test_lifetime.py keeps a test on a store no one has opened.)"""
    import shutil

    if not _store_template:
        import atexit
        import tempfile

        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        folder = Path(tempfile.mkdtemp(prefix="karman-store-"))
        atexit.register(shutil.rmtree, folder, True)
        SqlAlchemyStore(f"sqlite:///{folder / 'mlflow.db'}", str(folder / "mlartifacts")).engine.dispose()
        _store_template.append(folder / "mlflow.db")
    shutil.copyfile(_store_template[0], path)


def _isolate(folder: Path, monkeypatch) -> Path:
    _new_store(folder / "mlflow.db")
    monkeypatch.chdir(folder)
    monkeypatch.setenv("KARMAN_DATA_ROOT", str(folder / "data"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
    monkeypatch.setenv("KARMAN_ARTIFACT_ROOT", str(folder / "mlartifacts"))
    monkeypatch.setenv("KARMAN_EXPERIMENT", "test")
    return folder


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """cwd = a fresh folder; data, MLflow store and artifacts live inside it."""
    return _isolate(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def module_workdir(tmp_path_factory):
    """As ``workdir``, shared by a module's tests: for an expensive result (a dataset, a trained model,
    a pipeline run) built once and read by several tests."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield _isolate(tmp_path_factory.mktemp("module"), monkeypatch)


@pytest.fixture(scope="session")
def prefect_harness():
    """A real Prefect API for in-process flow runs: the session's shared server (``shared_prefect_api``),
    which the commands the tests run report to as well (one server, not two)."""
    from prefect.context import _temporary_global_settings_context, get_settings_context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: shared_prefect_api()}):
        # process-wide, as Prefect's own test harness does: threads the tests start report to it as well
        with _temporary_global_settings_context(get_settings_context()):
            yield


_shared_api: list[str] = []
SHARED_API_ENV = "KARMAN_TEST_PREFECT_API"  # the URL of the server xdist's controller started for its workers


def _start_prefect_server() -> tuple[subprocess.Popen, str, Path]:
    """A real Prefect server on a free port of 127.0.0.1, starting (not yet answering), stopped and its home removed at this
    process's exit: the process, its API's URL and its log."""
    import atexit
    import shutil
    import socket
    import tempfile

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    home = tempfile.mkdtemp(prefix="prefect-home-")
    log = open(Path(home) / "server.log", "w")
    # No scheduled, late or paused runs, workers or automations reach this server: the services that look
    # for them every few seconds stay off (the event, task-run and concurrency-lease services run).
    idle = {f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
            for name in ("SCHEDULER", "LATE_RUNS", "PAUSE_EXPIRATIONS", "FOREMAN", "CANCELLATION_CLEANUP", "TRIGGERS")}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env={**os.environ, "PREFECT_HOME": home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                                   "PREFECT_UI_ENABLED": "false", **idle}, stdout=log, stderr=subprocess.STDOUT)

    def stop() -> None:
        """The server stopped, then its home (its database, 20 MB after a full run) removed: a test session leaves nothing."""
        server.terminate()
        try:
            server.wait(30)
        finally:
            log.close()
            shutil.rmtree(home, ignore_errors=True)

    atexit.register(stop)
    return server, f"http://127.0.0.1:{port}/api", Path(home) / "server.log"


def _wait_healthy(url: str, server: subprocess.Popen | None = None, log: Path | None = None, timeout: float = 180) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            if (server is not None and server.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"the tests' Prefect server at {url} did not start" + (":\n" + log.read_text()[-3000:] if log else ""))
            time.sleep(0.5)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """The test modules and the libraries they import (MLflow, Prefect, torch) load without the cycle collector, and stay
    frozen: each collection of a worker that runs tests for half an hour then walks only what the tests made
    (tasks.common.process.collector)."""
    from tasks.common.process.collector import uncollected

    with uncollected():
        return (yield)


def pytest_configure(config):
    """Under xdist (make test), the controller starts one Prefect server that every worker's tests report to, instead of
    one per worker (each about 12 s of CPU to start and 2 s a minute while it runs); it starts while the workers do.

    The session's processes share one cache of this host's matmul ceilings (KARMAN_CEILINGS_FILE, as the several data roots
    of one host may): the first training run of a (device, framework, dtype) measures its quick ceiling, about 1 s of CPU,
    and every later one in any test's data root reads it. Tests of the cache itself clear the variable (``own_ceilings``)."""
    if not hasattr(config, "workerinput") and not os.environ.get(CEILINGS_ENV):
        import atexit
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="karman-ceilings-")
        atexit.register(shutil.rmtree, folder, True)
        os.environ[CEILINGS_ENV] = str(Path(folder) / "ceilings.json")
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput") and SHARED_API_ENV not in os.environ:
        _, os.environ[SHARED_API_ENV], log = _start_prefect_server()
        os.environ[SHARED_API_ENV + "_LOG"] = str(log)


@pytest.fixture(autouse=True)
def _sys_path_as_before():
    """``sys.path`` as it was before each test, whatever the test loaded: ``mlflow.pytorch.load_model`` prepends the logged
    model's copy of this project's code for good, and every process started from this worker afterwards (the warm servers,
    which take their parent's path) imported ``models`` from that copy, compiling the solver's numba kernels afresh there
    (three rollout jobs of tests/tasks/infer/test_rollout.py, 23.6 s of compiling under cProfile)."""
    before = list(sys.path)
    yield
    if sys.path != before:
        sys.path = before


@pytest.fixture
def own_ceilings(monkeypatch):
    """The test's data root keeps its own ceilings cache (<data root>/ceilings.json), not the session's shared one."""
    monkeypatch.delenv(CEILINGS_ENV, raising=False)


def shared_prefect_api() -> str:
    """The URL of one real Prefect server for this test session (xdist's controller's, shared by its workers) or, run
    without xdist, for this test process, started on first use and stopped at exit. Commands run by the tests report to
    it instead of each starting a temporary server of its own (about 5 s of CPU each); the tests that are about the
    temporary server unset it."""
    if not _shared_api:
        if os.environ.get(SHARED_API_ENV):
            _wait_healthy(os.environ[SHARED_API_ENV], log=Path(os.environ[SHARED_API_ENV + "_LOG"]))
            _shared_api.append(os.environ[SHARED_API_ENV])
        else:
            server, url, log = _start_prefect_server()
            _wait_healthy(url, server, log)
            _shared_api.append(url)
    return _shared_api[0]


def write_sweep(data_root: Path, spec) -> None:
    """The sweep of GenerateSpec ``spec`` written under ``data_root``/datasets as the generate flow writes it
    (its zarr groups, manifest and consolidated metadata), simulated here one after the other: for tests that
    need a finished dataset, not a sweep (no Dask cluster, no flow run)."""
    from tasks.common.stores.store import Manifest, consolidate
    from tasks.workloads.karman.simulate import run_simulation
    from tasks.workloads.karman.sweep import expand, sweep_key

    dataset_dir = data_root / "datasets" / spec.dataset
    manifest = Manifest(dataset_dir, sweep_key(spec))
    for sim in expand(spec):
        manifest.add(sim.sim_id, run_simulation(str(dataset_dir), sim.model_copy(update={"threads": 1})))
    consolidate(dataset_dir)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (a worker and its flow runs, a command and its children)."""
    import psutil

    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def _command_env(env: dict | None) -> dict:
    """What a command the tests run gets on top of this process's environment: the project on its path, no
    telemetry, the tests' Prefect server (unless ``env`` or this process names another), then ``env``."""
    return {"PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_API_URL": os.environ.get("PREFECT_API_URL") or shared_prefect_api(), **(env or {})}


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -m flows ...`` in a child process, as a user types it (reporting to the tests' Prefect
    server unless ``env`` sets PREFECT_API_URL, or sets it to "" for a temporary server of its own, as
    an empty value means to the command)."""
    full_env = {**os.environ, **_command_env(env)}
    return subprocess.run([sys.executable, "-m", "flows", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def _sigterm_when(condition: Callable[[str], bool] | None, err, signum: int = signal.SIGTERM):
    """``run_in_process``'s watcher, while the block runs: ``signum`` to this process, once, when ``condition`` holds for the
    command's stderr ``err`` (read again only when it has grown); after it, the signal handlers, the unraisable hook and
    the signals the command noted are as before. Without a condition, nothing."""
    if condition is None:
        yield
        return
    from tasks.common.process import lifetime

    handlers, hook = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}, sys.unraisablehook
    done = threading.Event()

    def watch():
        seen = 0
        while not done.wait(0.005):
            if err.tell() != seen:
                seen = err.tell()
                if condition(err.getvalue()):
                    os.kill(os.getpid(), signum)
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        sys.unraisablehook = hook
        lifetime._received.clear()
        lifetime._pending.clear()


class _NoGuardian:
    """What ``run_in_process`` gives main for its guardian: nothing to watch or stop."""

    def terminate(self) -> None:
        pass


def run_in_process(*args: str, cwd: Path, env: dict | None = None, sigterm_when: Callable[[str], bool] | None = None,
                   signum: int = signal.SIGTERM) -> subprocess.CompletedProcess:
    """``python -m flows ...`` as ``run_cli`` runs it, but in this test process: the same checks, flow and
    summary (``flows.cli.main``) in ``cwd`` with ``env`` added to the environment, its stdout and stderr
    captured, the environment and folder restored after. For tests about what a command computes and records,
    not about the command's process: each saves the 3-4 s of CPU a new process spends importing Prefect and
    MLflow. The two parts of main that are about a process's own death stay out (the guardian that would watch
    this test process, the SIGTERM handler); tests/flows/test_lifetime.py runs those as users do.

    With ``sigterm_when``, the command's SIGTERM handler stays, and this process sends itself SIGTERM once
    ``sigterm_when(stderr so far)`` holds, as a scheduler would send it to the command: the command stops its child, closes
    its run and says how to resume, here instead of in a new process (tests/tasks/train/interrupt.py); ``signum``: SIGINT
    instead, as Ctrl-C sends it. The handlers and the signals noted by the command are put back after."""
    import contextlib
    import io

    from prefect.context import _temporary_global_settings_context, get_settings_context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows import cli
    from tasks.common.process import lifetime

    full_env = _command_env(env)
    api = full_env["PREFECT_API_URL"] = full_env["PREFECT_API_URL"] or shared_prefect_api()  # a server: Prefect's temporary one cannot run in process
    saved, out, err = dict(os.environ), io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        patch.setattr(lifetime, "start_guardian", lambda settings=None: _NoGuardian())
        if sigterm_when is None:
            patch.setattr(lifetime, "raise_on_sigterm", lambda: None)
        os.environ.update(full_env)
        try:
            with temporary_settings({PREFECT_API_URL: api}), _temporary_global_settings_context(get_settings_context()):
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _logs_to(err), _sigterm_when(sigterm_when, err, signum):
                    try:
                        code = cli.main(list(args))
                    except SystemExit as exc:  # argparse's refusals and --help end the command this way
                        code = lifetime.exit_status(exc)
        finally:  # main sets variables of its own (credentials, verbosity): all of them go
            os.environ.clear()
            os.environ.update(saved)
    return subprocess.CompletedProcess(["python", "-m", "flows", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _logs_to(stream):
    """The log lines a command prints on its stderr, into ``stream``: Prefect's console handler writes to the stderr it
    found when Prefect configured its logging (this test process's), not to the one redirected for the command."""
    import logging

    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s - %(message)s"))
    loggers = [logging.getLogger(name) for name in ("prefect", "")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def strict_json(line: str):
    """A command's ``--json`` line parsed as strict JSON: a bare NaN or Infinity fails the test."""
    import json

    def refuse(constant: str):
        raise AssertionError(f"{constant} in a --json line: not JSON")

    return json.loads(line, parse_constant=refuse)
