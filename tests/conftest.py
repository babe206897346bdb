"""Shared fixtures: an isolated working folder with its own data root and MLflow store."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """cwd = a fresh folder; data, MLflow store and artifacts live inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KARMAN_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("KARMAN_ARTIFACT_ROOT", str(tmp_path / "mlartifacts"))
    monkeypatch.setenv("KARMAN_EXPERIMENT", "test")
    return tmp_path


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
