"""The quick benchmark exactly as a user runs it.

The quick benchmark exactly as a user runs it: ``python -m flows demo --json`` in a fresh folder,
logging to an MLflow store named by MLFLOW_TRACKING_URI; then a rerun of the sweep reuses the data."""

import json
import os

from mlflow.tracking import MlflowClient

from tests.conftest import run_cli, run_in_process


def test_demo_from_the_command_line_logs_where_told(tmp_path):
    env = {"MLFLOW_TRACKING_URI": "sqlite:///elsewhere.db", "KARMAN_DATA_ROOT": "data", "KARMAN_EXPERIMENT": "karman-bench",
           "PREFECT_API_URL": ""}  # no Prefect server: the command starts its temporary one, as for a new user
    proc = run_cli("demo", "--time-budget", "10", "--json", cwd=tmp_path, env=env)  # 10 s of training, not the default 180
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(summary) == {"tracking_uri", "experiment", "runs", "dataset", "report"}
    assert summary["tracking_uri"] == "sqlite:///elsewhere.db"
    assert (tmp_path / "elsewhere.db").exists() and not (tmp_path / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'elsewhere.db'}")
    exp = client.get_experiment_by_name("karman-bench")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) >= 4 and all(r.info.status == "FINISHED" for r in runs)
    assert (tmp_path / "data" / "reports" / "demo" / "report.md").exists()
    # the sweep's Dask cluster left OMP_NUM_THREADS=1 in this process; training still used every core
    train = client.get_run(summary["runs"]["train"])
    assert train.data.params["device_name"] == f"cpu ({os.cpu_count()} threads)"
    assert "training stops after epoch" in proc.stderr and ": time budget" in proc.stderr  # progress reached the terminal
    assert "validation: vorticity horizon" in proc.stderr
    assert "Traceback" not in proc.stderr  # an empty PREFECT_API_URL is no server, not an address to send events to

    # A second sweep with the same parameters reuses every simulation and keeps the digest (reporting to
    # the tests' Prefect server: the temporary one was the first command's subject).
    again = run_in_process("generate", "--json", cwd=tmp_path, env={k: v for k, v in env.items() if k != "PREFECT_API_URL"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["digest"] == summary["dataset"]["digest"]
    assert "9 already complete, 0 to run" in again.stderr
