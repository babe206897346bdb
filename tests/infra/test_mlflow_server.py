"""The MLflow server the infra scripts start, and the view its UI opens.

The MLflow server the infra scripts start: MLflow's own, whose UI opens an experiment on its runs in
the model-training view (MLflow 3.17's UI would open its GenAI view in a new browser), and whose root
opens the project's experiment on the benchmark's training runs, headline columns and charts."""

import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from infra.mlflow_server import (BROWSER_DEFAULTS, DEFAULTS_SCRIPT, SAVED_VIEW_PREFIX, VIEW_ID, VIEW_NAME,
                                 VIEW_STORAGE_KEY, benchmark_view, landing_page, view_script)
from tests.servers import Services, free_port, wait_http


def _ui_code() -> str:
    from mlflow.server import app

    return "".join(p.read_text(encoding="utf-8", errors="replace")
                   for p in (Path(app.static_folder) / "static" / "js").glob("*.js"))


def test_the_defaults_use_the_storage_keys_and_values_the_installed_ui_reads():
    code = _ui_code()
    assert "`${e}_v${t}`" in code  # how the UI names a stored setting: key and version
    for stored in BROWSER_DEFAULTS:
        key, version = stored.rsplit("_v", 1)
        assert f'key:"{key}",version:{version}' in code, stored
    assert 'MACHINE_LEARNING="machine_learning"' in code
    assert BROWSER_DEFAULTS["mlflow.workflowType_v1"] == "machine_learning"


def test_the_landing_page_sets_the_defaults_before_the_ui_code_loads():
    from mlflow.server import app

    page = landing_page((Path(app.static_folder) / "index.html").read_text(encoding="utf-8"))
    assert page.index(DEFAULTS_SCRIPT) < page.index("static/js/main.")
    with pytest.raises(RuntimeError, match="no <head>"):
        landing_page("<html><body></body></html>")
    view = view_script("7", benchmark_view([]))
    page = landing_page((Path(app.static_folder) / "index.html").read_text(encoding="utf-8"), view)
    assert page.index(DEFAULTS_SCRIPT) < page.index(view) < page.index("static/js/main.")


def _listed(code: str, first: str) -> list[str]:
    """The string array of the UI's code that starts with ``first``."""
    start = code.index(f'["{first}",')
    return json.loads(code[start:code.index("]", start) + 1])


def test_the_benchmark_view_uses_the_storage_and_state_keys_the_installed_ui_reads():
    code = _ui_code()
    # the runs page keeps its state per set of experiments in local storage: MLflowLocalStorage-1.1-ExperimentPage-["7"]-ReactComponentState
    assert 'getStoreForComponent("ExperimentPage",e)' in code and 'r.version="1.1"' in code
    assert '["MLflowLocalStorage",r.version,this.scope,e].join("-")' in code and 'reactComponentStateKey="ReactComponentState"' in code
    assert "new o([e,t].join(\"-\"),\"localStorage\")" in code and "JSON.stringify(e.sort())" in code
    assert VIEW_STORAGE_KEY.format(ids=json.dumps(["7"])) == 'MLflowLocalStorage-1.1-ExperimentPage-["7"]-ReactComponentState'
    view = benchmark_view(["test_accuracy", "test_f1"])
    facets, ui_state = _listed(code, "searchFilter"), _listed(code, "selectedColumns")
    assert set(view) <= set(facets) | set(ui_state), set(view) - set(facets) - set(ui_state)
    # a saved view: an experiment tag holding name, times and the state; ?viewStateShareKey=ID opens it
    assert f'="{SAVED_VIEW_PREFIX}"' in code and '="viewStateShareKey"' in code
    assert "expected an object with a string `name`, number `createdAt`, and string `state`" in code
    # what the state names: column ids, a group by tag, the chart and section kinds, MLflow's own sections
    assert 'I=(e,t)=>e+".`"+t+"`"' in code and 'e.Tag="tag"' in code and 'e.Average="average"' in code
    assert 'e.BAR="BAR"' in code and 'e.SCATTER="SCATTER"' in code and '"Model metrics"' in code and '"System metrics"' in code
    assert view["selectedColumns"][:4] == ["tags.`karman.workload`", "tags.`karman.framework`", "tags.`karman.device`",
                                           "tags.`karman.batch_size`"]
    assert {"metrics.`time_to_target_s`", "metrics.`samples_per_s`", "metrics.`mfu_ceiling`", "metrics.`test_accuracy`",
            "metrics.`test_f1`", "metrics.`energy_j`", "metrics.`cost`"} <= set(view["selectedColumns"])
    charts = {c.get("metricKey") for c in view["compareRunCharts"]}
    assert {"samples_per_s", "time_to_target_s"} <= charts
    # each energy beside its scope, and no chart of energies side by side (their scopes may differ: GPU board, CPU package)
    energy = view["selectedColumns"].index("metrics.`energy_j`")
    assert view["selectedColumns"][energy + 1] == "params.`energy_scope`" and "energy_j" not in charts


BENCH = "bench-view"  # the project's experiment on the tests' server (KARMAN_EXPERIMENT)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """infra/start-mlflow-server.sh on a free port over a new store, with two training runs logged."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    services = Services(folder, {k: v for k, v in os.environ.items() if k != "MLFLOW_WORKERS"})  # the server's own choice of workers
    try:
        proc, log = services.start("mlflow-server", ["infra/start-mlflow-server.sh"], {
            "PORT": str(port), "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{folder / 'mlflow.db'}",
            "KARMAN_ARTIFACT_ROOT": str(folder / "mlartifacts"), "KARMAN_EXPERIMENT": BENCH})
        uri = f"http://127.0.0.1:{port}"
        wait_http(f"{uri}/health", 180, proc, log)
        client = MlflowClient(tracking_uri=uri)
        exp = client.create_experiment("surrogates", tags={"mlflow.experimentKind": "custom_model_development"})
        for batch in (4, 8):
            run = client.create_run(exp, run_name=f"train-cpu-b{batch}")
            client.log_metric(run.info.run_id, "epoch_time_s", 1.0 + batch, step=0)
            client.set_terminated(run.info.run_id)
        yield uri, exp, proc
    finally:
        services.stop()


@pytest.mark.full
def test_the_server_runs_no_genai_job_consumers_and_no_more_workers_than_cores(server):
    import psutil

    _, _, proc = server
    commands = [" ".join(p.cmdline()) for p in psutil.Process(proc.pid).children(recursive=True)]
    assert not [c for c in commands if "huey" in c or "_job_runner" in c], commands  # MLflow 3 starts eight otherwise
    workers = [c for c in commands if "multiprocessing.spawn" in c]  # uvicorn's worker processes (none for one worker)
    assert len(workers) <= min(4, os.cpu_count() or 1), commands


@pytest.mark.full
def test_the_server_serves_mlflow_with_the_landing_page_defaults(server):
    uri, exp, _ = server
    with urllib.request.urlopen(uri + "/", timeout=10) as response:
        page = response.read().decode()
        assert response.headers["Cache-Control"] == "no-cache"
    assert DEFAULTS_SCRIPT in page
    # the tracking API is MLflow's: the runs logged through it read back
    runs = MlflowClient(tracking_uri=uri).search_runs([exp])
    assert sorted(r.info.run_name for r in runs) == ["train-cpu-b4", "train-cpu-b8"]
    with urllib.request.urlopen(f"{uri}/ajax-api/2.0/mlflow/experiments/get?experiment_id={exp}", timeout=10) as response:
        assert json.loads(response.read())["experiment"]["name"] == "surrogates"


@pytest.mark.full
def test_stdout_holds_only_the_json_summary_against_a_server(server, workdir):
    from tests.conftest import run_cli

    uri, _, _ = server
    done = run_cli("generate", "--workload", "digits", "--dataset", "digits", "--json", cwd=workdir,
                   env={"MLFLOW_TRACKING_URI": uri, "KARMAN_EXPERIMENT": "json-stdout"})
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert summary["dataset"] == "digits" and summary["run_id"]
    assert "View run" not in done.stdout and done.stdout.count("\n") == 1


@pytest.fixture(scope="module")
def benchmark(server):
    """The project's experiment with a benchmark run and its three training runs (two workloads), as the flows log them."""
    uri, _, _ = server
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(BENCH)
    parent = client.create_run(exp, run_name="benchmark-quick", tags={"karman.stage": "benchmark"})
    for workload, framework, seconds in (("digits", "torch", 3.0), ("digits", "jax", 2.0), ("har", "torch", 5.0)):
        run = client.create_run(exp, run_name=f"{workload}-{framework}-cpu-b64", tags={
            "mlflow.parentRunId": parent.info.run_id, "karman.stage": "train", "karman.workload": workload,
            "karman.framework": framework, "karman.device": "cpu", "karman.batch_size": "64"})
        for key, value in {"time_to_target_s": seconds, "samples_per_s": 600 / seconds, "mfu_ceiling": 0.02, "test_accuracy": 0.9,
                           "test_loss": 0.3, "energy_j": 40 * seconds, "cost": 1e-4 * seconds}.items():
            client.log_metric(run.info.run_id, key, value, step=0)
        client.log_param(run.info.run_id, "energy_scope", "CPU package")
        client.set_terminated(run.info.run_id)
    client.set_terminated(parent.info.run_id)
    return exp


@pytest.mark.full
def test_the_servers_root_holds_the_benchmark_view_of_the_project_experiment(server, benchmark):
    uri, _, _ = server
    view = benchmark_view(["test_accuracy"])  # a test score; test_loss is not one
    saved = []
    for _ in range(2):
        with urllib.request.urlopen(uri + "/", timeout=10) as response:
            page = response.read().decode()
        assert DEFAULTS_SCRIPT in page and view_script(benchmark, view) in page
        saved.append(json.loads(MlflowClient(tracking_uri=uri).get_experiment(benchmark).tags[SAVED_VIEW_PREFIX + VIEW_ID]))
    # the experiment has it as a saved view (the UI's Views list), written once, not at every request
    assert saved[0]["name"] == VIEW_NAME and json.loads(saved[0]["state"]) == view and saved[1] == saved[0]


def _rendered(url: str, width: int = 1500) -> str:
    """The page's DOM after its scripts ran, in headless Chromium with a new profile (a first visit)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium on this machine")
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               "--disable-background-networking", "--disable-component-update", "--disable-sync",
                               f"--user-data-dir={profile}", f"--window-size={width},950", "--virtual-time-budget=15000",
                               "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.full
def test_a_new_browser_opens_the_experiment_on_its_runs_in_the_training_view(server):
    uri, exp, _ = server
    dom = _rendered(f"{uri}/#/experiments/{exp}")
    assert "train-cpu-b4" in dom and "train-cpu-b8" in dom  # the runs table, not the GenAI overview
    assert "Detect Issues" not in dom
    # a link may still ask for the GenAI view
    dom = _rendered(f"{uri}/#/experiments/{exp}?workflowType=genai")
    assert "train-cpu-b4" not in dom and "Detect Issues" in dom


@pytest.mark.full
def test_a_new_browser_opens_the_servers_root_on_the_benchmarks_training_runs_and_charts(server, benchmark):
    uri, _, _ = server
    dom = _rendered(f"{uri}/", width=2600)
    names = ["digits-jax-cpu-b64", "digits-torch-cpu-b64", "har-torch-cpu-b64"]
    assert all(name in dom for name in names) and "benchmark-quick" not in dom  # the training runs, not their benchmark
    assert [dom.index(name) for name in names] == sorted(dom.index(name) for name in names)  # by time to target
    assert "Group: digits" in dom and "Group: har" in dom
    for column in benchmark_view(["test_accuracy"])["selectedColumns"]:
        assert f'col-id="{column}"' in dom, column
    dom = _rendered(f"{uri}/#/experiments/{benchmark}/runs?compareRunsMode=CHART", width=2600)
    assert "Benchmark" in dom and "samples_per_s" in dom and "time_to_target_s" in dom
