"""The benchmark as users drive it through deployed servers, pools and workers.

The benchmark as users drive it: a real Prefect server and MLflow tracking server started by the
infra scripts on 127.0.0.1 (free ports) in their authenticated mode, their stores in the PostgreSQL
server of infra/start-postgres.sh (credentials from an owner-only file), the pools and ``prefect deploy
--all`` from prefect.yaml (infra/deploy.sh), a process worker on the ``cpu`` pool, and
``benchmark/quick`` triggered through the API as the UI does. The worker is killed mid-run, a new one
started and the run triggered again: finished cells are skipped, the data is reused, and the runs and
the report are read back from the MLflow server. Everything is shut down, also on failure."""

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from infra.postgres import bindir
from tasks.common.tracking.credentials import auth_refused
from tasks.common.config.errors import UserError
from tasks.common.specs import BenchmarkSpec
from tasks.workloads.presets import quick_benchmark
from tests.conftest import ROOT, kill_tree
from tests.servers import AUTH_PASSWORD, AUTH_USER, Services, authenticated, free_port, wait_http, wait_postgres

def wait_for_finished_train_cell(uri: str, worker: subprocess.Popen, log: Path, timeout: float = 900):
    """The first FINISHED training run of a benchmark cell in the MLflow server's 'deployed' experiment."""
    mlflow = MlflowClient(tracking_uri=uri)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        experiment = mlflow.get_experiment_by_name("deployed")
        if experiment is not None:
            runs = mlflow.search_runs([experiment.experiment_id], "tags.`karman.stage` = 'train' and attributes.status = 'FINISHED'")
            runs = [r for r in runs if "karman.cell" in r.data.tags]
            if runs:
                return runs[0]
        assert worker.poll() is None, log.read_text()[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"no training cell finished within {timeout} s:\n{log.read_text()[-3000:]}")


def test_quick_prefect_yaml_parameters_are_the_quick_matrix():
    from tasks.workloads.presets import benchmark_preset, presets

    deployments = yaml.safe_load((Path(ROOT) / "prefect.yaml").read_text())["deployments"]
    quick = next(d for d in deployments if d["entrypoint"].endswith(":benchmark") and d["name"] == "quick")
    assert BenchmarkSpec.model_validate(quick["parameters"]["spec"]) == quick_benchmark()
    assert quick["work_pool"]["name"] == "cpu"
    # every preset is a deployment of the benchmark with the preset's matrix, as the run form shows it
    benchmarks = {d["name"]: d for d in deployments if d["entrypoint"].endswith(":benchmark")}
    assert set(presets()) <= set(benchmarks)
    for name in presets():
        assert BenchmarkSpec.model_validate(benchmarks[name]["parameters"]["spec"]) == benchmark_preset(name), name
    frameworks = benchmark_preset("frameworks")
    assert (frameworks.frameworks, frameworks.batch_sizes, frameworks.repeats, frameworks.train.options["karman"].ngf) == (["torch", "tensorflow"], [8], 2, 16)
    nightly = next(d for d in deployments if d["entrypoint"].endswith(":benchmark") and d["name"] == "nightly")
    assert nightly["schedules"][0]["cron"] == "0 2 * * *"
    pools = {(d["entrypoint"].rsplit(":", 1)[1], d["name"]): d["work_pool"] for d in deployments}
    assert pools[("train", "tpu")]["job_variables"]["env"]["PJRT_DEVICE"] == "TPU"
    assert {pools[("train", p)]["name"] for p in ("cpu", "gpu", "tpu")} == {"cpu", "gpu", "tpu"}


@pytest.mark.timeout(1500)
def test_quick_benchmark_deployed_on_real_servers_and_a_worker(tmp_path, monkeypatch):
    try:
        bindir(dict(os.environ))
    except UserError as exc:
        pytest.skip(f"the servers' PostgreSQL cannot start here: {exc}")
    prefect_port, mlflow_port, pg_port = free_port(), free_port(), free_port()
    api = f"http://127.0.0.1:{prefect_port}/api"
    # The servers authenticate (AUTH=1) and keep their stores in PostgreSQL; the servers, deploy.sh, the
    # workers and this test's clients read the same owner-only credentials file. (The cluster's folder lies
    # outside tmp_path: started by root, PostgreSQL runs as the postgres account, which may not enter it.)
    pgdata = Path(tempfile.mkdtemp(prefix="karman-pgdata-"))
    auth = authenticated(tmp_path)
    own = ("MLFLOW_TRACKING_", "PREFECT_API_", "PGUSER", "PGPASSWORD", "PGHOST")  # what this test sets
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(own)}, **auth,
           "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PYTHONPATH": str(ROOT), "DATABASE": "postgresql", "PGDATA": str(pgdata), "PGPORT": str(pg_port),
           "KARMAN_DB_AUTH_FILE": auth["KARMAN_MLFLOW_AUTH_FILE"]}
    for key, value in {"MLFLOW_TRACKING_USERNAME": AUTH_USER, "MLFLOW_TRACKING_PASSWORD": AUTH_PASSWORD}.items():
        monkeypatch.setenv(key, value)  # what MLflow's client in this process sends
    services = Services(tmp_path, env)
    try:
        database, database_log = services.start("postgres", ["infra/start-postgres.sh"])
        # MLflow retries its store until PostgreSQL listens (it starts the slowest); Prefect waits for it
        tracking, tracking_log = services.start("mlflow-server", ["infra/start-mlflow-server.sh"], {
            "PORT": str(mlflow_port), "KARMAN_ARTIFACT_ROOT": str(tmp_path / "mlartifacts")})
        wait_postgres(pg_port, "prefect", 120, database, database_log)
        server, server_log = services.start("prefect-server", ["infra/start-prefect-server.sh"], {"PORT": str(prefect_port)})
        wait_http(f"{api}/health", 180, server, server_log)
        wait_http(f"http://127.0.0.1:{mlflow_port}/health", 180, tracking, tracking_log)
        # neither server serves a request without the credentials
        search = f"http://127.0.0.1:{mlflow_port}/api/2.0/mlflow/experiments/search?max_results=1"
        quick_url = f"{api}/deployments/name/benchmark/quick"
        assert [auth_refused(search, None), auth_refused(f"{api}/admin/version", None)] == [401, 401]
        assert auth_refused(search, f"{AUTH_USER}:{AUTH_PASSWORD}") is None

        deploy = subprocess.run(["infra/deploy.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]

        uri = f"http://127.0.0.1:{mlflow_port}"
        # (the workers poll every 2 s, not Prefect's 10: each run sent below starts without waiting out a poll)
        worker_env = {"MLFLOW_TRACKING_URI": uri, "KARMAN_DATA_ROOT": str(tmp_path / "data"), "KARMAN_EXPERIMENT": "deployed",
                      "PREFECT_WORKER_QUERY_SECONDS": "2"}
        worker, worker_log = services.start("worker", ["infra/start-worker.sh", "cpu"], worker_env)

        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectNotFound
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

        prefect_auth = f"{AUTH_USER}:{AUTH_PASSWORD}"
        with temporary_settings({PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: prefect_auth}), get_client(sync_client=True) as client:
            def until(condition, timeout: float, what: str, every: float = 0.5):
                """condition()'s first true value, polled while the worker lives; fails naming ``what`` after ``timeout`` s."""
                deadline = time.monotonic() + timeout
                while not (found := condition()):
                    assert time.monotonic() < deadline, f"{what} within {timeout} s:\n{worker_log.read_text()[-5000:]}"
                    assert worker.poll() is None, worker_log.read_text()[-3000:]
                    time.sleep(every)
                return found

            def wait(flow_run_id, timeout: float = 1200):
                final = lambda state: state if state is not None and state.is_final() else None  # noqa: E731
                return until(lambda: final(client.read_flow_run(flow_run_id).state), timeout, f"flow run {flow_run_id} not done", every=2)

            deployment = client.read_deployment_by_name("benchmark/quick")
            assert [auth_refused(quick_url, None), auth_refused(quick_url, prefect_auth)] == [401, None]
            with pytest.raises(ObjectNotFound):
                client.read_deployment_by_name("benchmark/nope")
            # parameters the form's schema rejects never become a run
            with pytest.raises(Exception, match="gpu"):
                client.create_flow_run_from_deployment(deployment.id, parameters={"spec": {"devices": ["gpu"]}})
            # a cell's deployment: its form leaves out what the benchmark sets, its server takes and checks it
            # (the gpu pool has no worker here: the run is deleted before anything could start it)
            cell_deployment = client.read_deployment_by_name("train/gpu")
            form = cell_deployment.parameter_openapi_schema
            assert list(form["properties"]) == ["spec"] and "cell" not in form["definitions"]["TrainSpec"]["properties"]
            cell_run = client.create_flow_run_from_deployment(cell_deployment.id, parameters={
                "spec": {"device": "cuda", "batch_sizes": [4], "cell": "0123456789abcdef"}, "parent_run": "a" * 32})
            assert cell_run.parameters["spec"]["cell"] == "0123456789abcdef"
            client.delete_flow_run(cell_run.id)
            with pytest.raises(Exception, match="does not match"):
                client.create_flow_run_from_deployment(cell_deployment.id, parameters={"spec": {"cell": "not-a-key"}})
            # checks beyond the schema fail the run at once, with the validation message as its state
            for parameters, message in (({"modes": ["full"], "workers": [2]}, "the rollout matrix has no cells"),
                                        ({"devices": ["cpu", "cuda"], "pools": {"cuda": "nope"}}, "deployment(s) train/nope not found")):
                bad = client.create_flow_run_from_deployment(deployment.id, parameters={"spec": parameters})
                state = wait(bad.id, 300)
                assert state.is_failed() and message in (state.message or ""), state

            # What the UI's "Quick run" does. The worker is killed (with its flow run and every child)
            # once the first training cell has finished; a new worker and a second run finish the job.
            # (a custom run of the quick matrix, as the UI's form makes: a sweep of four simulations with a shorter
            # warm-up instead of nine; one training cell, batch 4, of one epoch of at most eight steps instead of three
            # epochs of 106; the cell still validates, checkpoints and logs its model; the three rollout cells as in
            # the quick matrix)
            quick = quick_benchmark()
            short = quick.train.model_copy(update={"epochs": 1, "max_steps": 8})
            sections = quick.generate.model_dump()
            sweep = type(quick.generate).model_validate(sections | {"options": sections["options"] | {"karman": {"reynolds": [80.0, 95.0, 110.0, 125.0], "warmup_steps": 4000}}})
            custom = {"spec": json.loads(quick.model_copy(update={"generate": sweep, "train": short, "batch_sizes": [4], "per_workload": {}}).model_dump_json())}
            first = client.create_flow_run_from_deployment(deployment.id, parameters=custom)
            done_cell = wait_for_finished_train_cell(uri, worker, worker_log)
            # its Prefect flow run completed too (it closes its MLflow run first): the kill lands between cells, and
            # that run is the completed training run (with its progress artifact) the checks below read
            from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, FlowRunFilterState, FlowRunFilterStateType
            from prefect.client.schemas.objects import StateType

            completed = FlowRunFilter(name=FlowRunFilterName(any_=["train karman torch cpu b4"]),
                                      state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.COMPLETED])))
            until(lambda: client.read_flow_runs(flow_run_filter=completed), 120, "the training cell's flow run did not complete")
            kill_tree(worker.pid)
            assert not client.read_flow_run(first.id).state.is_completed()
            worker, worker_log = services.start("worker-2", ["infra/start-worker.sh", "cpu"], worker_env)
            second = client.create_flow_run_from_deployment(deployment.id, parameters=custom)
            state = wait(second.id)
            assert state.is_completed(), f"{state}\n{worker_log.read_text()[-5000:]}"
            # one log line per cell: its status and its MLflow link
            assert any(": SKIPPED in" in line and done_cell.info.run_id in line and "finished earlier, reused" in line
                       for line in worker_log.read_text().splitlines())
            children = client.read_flow_runs()
            names = sorted({client.read_flow(r.flow_id).name for r in children})
            # what the Prefect UI shows: runs named and tagged by their parameters, the report (figures
            # inline) on the benchmark's own run, progress artifacts of the training runs
            run_names = {r.name for r in children}
            assert {"benchmark quick", "generate karman-demo", "train karman torch cpu b4", "aggregate quick"} <= run_names, run_names
            rollouts = {name.partition(" model ")[0]: name for name in run_names if name.startswith("infer ")}  # ... model 0123abcd
            assert {"infer full cpu x1", "infer mapreduce cpu x2"} <= set(rollouts), run_names
            tagged = {r.name: set(r.tags) for r in children if r.parent_task_run_id or r.name.startswith(("train", "infer"))}
            assert {"stage:train", "device:cpu", "batch:4"} <= tagged["train karman torch cpu b4"]
            assert {"stage:infer", "mode:mapreduce", "workers:2"} <= tagged[rollouts["infer mapreduce cpu x2"]]
            from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType

            own = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[second.id])))
            report_artifact = next(a for a in own if a.type == "markdown" and (a.key or "").endswith("-report"))
            mlflow_link = next(a for a in own if (a.key or "").startswith("mlflow-"))  # the flow run links its MLflow run
            assert f"http://127.0.0.1:{mlflow_port}/#/experiments/" in mlflow_link.data
            assert "![train_samples_per_s](data:image/png;base64," in report_artifact.data
            assert f"http://127.0.0.1:{mlflow_port}/#/experiments/" in report_artifact.data  # run ids link to MLflow
            assert any(a.type == "progress" and a.data == 100 for a in own)  # the cells' progress
            train_runs = [r.id for r in children if r.name.startswith("train karman torch cpu") and r.state.is_completed()]
            progress = client.read_artifacts(artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress"]),
                                                                            flow_run_id=ArtifactFilterFlowRunId(any_=train_runs)))
            assert progress and all(a.data == 100 for a in progress)
        assert {"benchmark", "generate", "train", "infer", "aggregate"} <= set(names)

        mlflow = MlflowClient(tracking_uri=uri)
        experiment = mlflow.get_experiment_by_name("deployed")
        runs = mlflow.search_runs([experiment.experiment_id])
        stages = sorted(r.data.tags.get("karman.stage") for r in runs)
        finished = [r for r in runs if r.info.status == "FINISHED"]
        cells = [r.data.tags["karman.cell"] for r in finished if "karman.cell" in r.data.tags]
        assert len(cells) == 4 and len(set(cells)) == 4  # 1 training + 3 rollout cells, each finished once
        assert done_cell.info.run_id in {r.info.run_id for r in finished}  # kept, not redone
        # the runs and flow runs live in PostgreSQL, not in a SQLite file
        import psycopg2

        with psycopg2.connect(host="127.0.0.1", port=pg_port, user=AUTH_USER, password=AUTH_PASSWORD, dbname="mlflow") as db:
            with db.cursor() as cursor:
                cursor.execute("SELECT run_uuid FROM runs WHERE experiment_id = %s", (int(experiment.experiment_id),))
                assert {row[0] for row in cursor.fetchall()} == {r.info.run_id for r in runs}
        with psycopg2.connect(host="127.0.0.1", port=pg_port, user=AUTH_USER, password=AUTH_PASSWORD, dbname="prefect") as db:
            with db.cursor() as cursor:
                cursor.execute("SELECT state_type FROM flow_run WHERE id = %s", (str(second.id),))
                assert cursor.fetchall() == [("COMPLETED",)]
        assert not (tmp_path / "prefect-home" / "prefect.db").exists()
        assert sum(r.data.tags.get("karman.stage") == "generate" and r.info.status == "FINISHED" for r in runs) == 2
        manifest = json.loads((tmp_path / "data" / "datasets" / "karman-demo" / "manifest.json").read_text())
        assert len(manifest["simulations"]) == 4  # the data written before the kill is intact and was reused
        assert "4 already complete, 0 to run" in worker_log.read_text()
        aggregate = next(r for r in runs if r.data.tags.get("karman.stage") == "aggregate")
        artifacts = {a.path for a in mlflow.list_artifacts(aggregate.info.run_id, "report")}
        assert {"report/report.md", "report/report.html"} <= artifacts
        report = Path(mlflow.download_artifacts(aggregate.info.run_id, "report/report.md", str(tmp_path / "dl"))).read_text()
        assert "| cpu | mapreduce | 2 |" in report and "Training: device × batch size" in report

        # What the MLflow UI shows: a model-training experiment; the second benchmark's run holds the
        # report and lists its four cells, the new ones its children; descriptions and tags; the dataset
        # as an input; the generator as a logged model that loads with MLflow's own API.
        assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
        benchmarks = [r for r in runs if r.data.tags.get("karman.stage") == "benchmark"]
        bench = next(r for r in benchmarks if r.info.status == "FINISHED")
        assert {"report/report.md", "report/report.html"} <= {a.path for a in mlflow.list_artifacts(bench.info.run_id, "report")}
        listed = json.loads(Path(mlflow.download_artifacts(bench.info.run_id, "runs.json", str(tmp_path / "dl"))).read_text())
        assert sorted(c["status"] for c in listed["cells"]) == ["FINISHED"] * 3 + ["SKIPPED"]
        assert set(listed["runs"]) == {r.info.run_id for r in finished if "karman.cell" in r.data.tags}
        parents = {r.data.tags.get("mlflow.parentRunId") for r in finished if r.data.tags.get("karman.stage") in ("train", "infer", "aggregate")}
        assert parents <= {b.info.run_id for b in benchmarks} and bench.info.run_id in parents
        assert bench.info.run_id in report  # the report says which benchmark it covers
        assert all(r.data.tags.get("mlflow.note.content") for r in finished)
        trained = next(r for r in finished if r.data.tags.get("karman.stage") == "train")
        assert trained.data.tags["karman.batch_size"] == "4" and trained.data.tags["karman.framework"] == "torch"
        assert [d.dataset.name for d in trained.inputs.dataset_inputs] == ["karman-demo"]
        models = mlflow.search_logged_models([experiment.experiment_id])
        assert {m.source_run_id for m in models} >= {r.info.run_id for r in finished if r.data.tags.get("karman.stage") == "train"}
        import mlflow as mlflow_api
        import mlflow.pytorch
        import numpy as np
        import torch

        # (MLflow's process-wide URI, and the environment variable it sets, go back as they were: the
        # next tests in this process must not talk to this server after it stops)
        before_env = os.environ.get("MLFLOW_TRACKING_URI")
        mlflow_api.set_tracking_uri(uri)
        try:
            surrogate = mlflow.pytorch.load_model(trained.data.tags["karman.model_uri"], dst_path=tempfile.mkdtemp(dir=tmp_path))
            with torch.no_grad():
                out = surrogate(torch.zeros(1, 4, 64, 128))
            assert out.shape == (1, 3, 64, 128) and np.isfinite(out.numpy()).all()
            version = mlflow_api.register_model(trained.data.tags["karman.model_uri"], "karman-generator")
            assert version.version == "1"
        finally:
            mlflow_api.set_tracking_uri(None)  # back to no process-wide URI (this also unsets the variable)
            if before_env is not None:
                os.environ["MLFLOW_TRACKING_URI"] = before_env

        # Devices shared out: two cells sent to the cpu pool at once run one after the other (the pool's
        # one-slot limit, which deploy.sh created), while a cell sent to the gpu pool (on this host, its
        # spec on the cpu) runs beside them.
        gpu_worker, gpu_log = services.start("worker-gpu", ["infra/start-worker.sh", "gpu"], worker_env)
        tiny = {"dataset": "karman-demo", "epochs": 1, "max_steps": 3, "batch_sizes": [4], "threads": 1, "device": "cpu",
                "options": {"ngf": 8, "ndf": 8, "val_simulations": 0}}
        with temporary_settings({PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: prefect_auth}), get_client(sync_client=True) as client:
            def send(pool: str, seed: int):
                return client.create_flow_run_from_deployment(client.read_deployment_by_name(f"train/{pool}").id,
                                                              parameters={"spec": {**tiny, "seed": seed}})

            sent = [send("cpu", 10), send("cpu", 11)]
            # the gpu pool's cell is sent once a cpu cell runs: sent with them, its three steps could be done before
            # the cpu worker's next poll picked up the cpu cells
            until(lambda: any(client.read_flow_run(r.id).state.is_running() for r in sent), 300, "no cpu cell running")
            sent.append(send("gpu", 12))
            for flow_run in sent:
                state = wait(flow_run.id, 600)
                assert state.is_completed(), f"{state}\n{worker_log.read_text()[-3000:]}\n{gpu_log.read_text()[-3000:]}"
        spans, tracked = [], MlflowClient(tracking_uri=uri)  # (the name mlflow is the module here since `import mlflow.pytorch`)
        for flow_run in sent:
            trained = tracked.search_runs([experiment.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run.id}' and tags.`karman.stage` = 'train'")
            assert trained, flow_run.id
            spans.append((min(r.info.start_time for r in trained), max(r.info.end_time for r in trained)))
        (a0, a1), (b0, b1), (g0, g1) = spans
        assert a1 <= b0 or b1 <= a0, spans  # the cpu pool's two cells never overlapped
        assert g0 < max(a1, b1) and min(a0, b0) < g1, spans  # the gpu pool's cell ran beside them
        assert "for a slot of concurrency limit pool-cpu" in worker_log.read_text()  # the later cpu cell waited, and said so
    finally:
        services.stop()
        shutil.rmtree(pgdata, ignore_errors=True)
    assert all(p.poll() is not None for p in services.procs)
