"""Shared fixtures: an isolated working folder with its own data root and MLflow store."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The full tier: modules whose tests start servers, run flows end to end or train models for minutes.
# ``make test-fast`` (pytest -m "not full") leaves them out, with the tests marked ``full`` elsewhere;
# ``make test`` (CI) runs everything.
FULL_TIER_MODULES = {"test_deployed.py", "test_end_to_end.py", "test_benchmark_flow.py", "test_pipeline.py", "test_training.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in FULL_TIER_MODULES:
            item.add_marker(pytest.mark.full)


def _isolate(folder: Path, monkeypatch) -> Path:
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
    """A real (temporary) Prefect API for in-process flow runs."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -m flows ...`` in a child process, as a user types it."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env or {})}
    return subprocess.run([sys.executable, "-m", "flows", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
