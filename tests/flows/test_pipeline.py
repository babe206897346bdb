"""Smoke run of every flow on a tiny grid.

Smoke run of every flow on a tiny grid, in process against a real Prefect API, a real Dask
LocalCluster, real zarr stores and a real MLflow store; MLflow runs and Prefect flow runs link to each other."""

import json
import logging
import tempfile

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.context import FlowRunContext
from prefect.settings import PREFECT_UI_URL

from tasks.common.process.launch import run_child
from tasks.common.config.settings import Settings
from tasks.common.specs import AggregateSpec, DemoSpec, GenerateSpec, InferSpec, TrainSpec
from tasks.common.tracking.runs import LOCAL_MLFLOW_UI, mlflow_run

TINY = DemoSpec(
    generate=GenerateSpec(dataset="tiny", reynolds=[40.0, 50.0, 60.0], nx=64, ny=32, size=[6.0], warmup_steps=1500,
                          frames=10, frame_every=40, workers=2),
    train=TrainSpec(dataset="tiny", ngf=8, ndf=8, epochs=2, batch_sizes=[4], threads=1),
    infer=InferSpec(steps=4),
    aggregate=AggregateSpec(name="tiny"),
)


@pytest.fixture(scope="module")
def demo_result(module_workdir, prefect_harness):
    """One demo run for the module's tests (they read it, and add runs of their own beside it)."""
    from flows import pipeline

    return pipeline.demo(TINY)


@pytest.fixture
def workdir(module_workdir):
    return module_workdir


def test_demo_flow_logs_every_stage_and_writes_a_report(demo_result, workdir):
    client = MlflowClient(tracking_uri=demo_result["tracking_uri"])
    runs = {stage: client.get_run(run_id) for stage, run_id in demo_result["runs"].items()}
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    assert {r.data.tags["karman.stage"] for r in runs.values()} == {"demo", "generate", "train", "infer", "aggregate"}
    # every stage is a child of the demo's run, and the report covers the demo's own runs
    assert {runs[s].data.tags.get("mlflow.parentRunId") for s in ("generate", "train", "infer", "aggregate")} == {demo_result["runs"]["demo"]}
    assert all(r.data.tags.get("mlflow.note.content") for r in runs.values())
    train, infer = runs["train"], runs["infer"]
    assert train.data.params["dataset_digest"] == demo_result["dataset"]["digest"]
    # the network trained: per-step L1 history exists and is finite
    history = client.get_metric_history(train.info.run_id, "step_loss_l1")
    assert len(history) >= 2 and all(np.isfinite(m.value) for m in history)
    artifacts = {a.path for a in client.list_artifacts(infer.info.run_id)}
    assert {"vorticity_rollout.png", "rollout_error.png"} <= artifacts
    assert {a.path for a in client.list_artifacts(train.info.run_id, "model")} == {"model/generator.pt", "model/meta.json"}
    errors = client.get_metric_history(infer.info.run_id, "rel_l2_u")
    assert [m.step for m in errors] == [1, 2, 3, 4]
    # linked runs: each stage's run names the flow run it ran in (the demo's, or the stage's subflow run),
    # and that flow run has a link artifact to it
    flow_runs = {stage: r.data.tags["prefect.flow_run_id"] for stage, r in runs.items()}
    assert len(set(flow_runs.values())) == len(runs)
    with get_client(sync_client=True) as prefect:
        for stage, r in runs.items():
            assert r.data.tags["prefect.flow_run_url"] == f"{PREFECT_UI_URL.value()}/runs/flow-run/{flow_runs[stage]}"
            assert f"({r.data.tags['prefect.flow_run_url']})" in r.data.tags["mlflow.note.content"]
            links = mlflow_links(prefect.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_runs[stage]]))))
            assert any(f"/runs/{r.info.run_id}?" in a.data for a in links), (stage, [a.data for a in links])
    report = (workdir / "data" / "reports" / "tiny" / "report.md").read_text()
    assert "| 4 | cpu x1 | 1 |" in report and "| cpu | full | 1 |" in report
    assert f"the runs of demo run demo ({demo_result['runs']['demo']})" in report
    page = (workdir / "data" / "reports" / "tiny" / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "<table>" in page and '<img alt="train_samples_per_s" src="data:image/png;base64,' in page
    # a report rebuilt later over the newest benchmark or demo covers the same two runs
    from flows import pipeline

    again = pipeline.aggregate(AggregateSpec(name="again"))
    assert demo_result["runs"]["demo"] in again["scope"]
    assert [r["run"] for r in again["train_rows"]] == [train.info.run_id] and [r["run"] for r in again["infer_rows"]] == [infer.info.run_id]


def test_rollout_feeds_predictions_back(demo_result, workdir):
    """The logged errors are those of the generator applied to its own previous prediction: replaying
    the rollout here from the saved model reproduces them, and one-step predictions from the
    reference frames (what a rollout that did not feed back would score) do not."""
    import torch

    from tasks.workloads.karman.data import StepCodec, load_frames
    from models.karman.flow_metrics import relative_l2
    from tasks.workloads.karman.infer.torch import load_model
    from tasks.common.config.settings import Settings

    settings = Settings.from_env()
    client = MlflowClient(tracking_uri=demo_result["tracking_uri"])
    infer = client.get_run(demo_result["runs"]["infer"])
    logged = [m.value for m in sorted(client.get_metric_history(infer.info.run_id, "rel_l2_u"), key=lambda m: m.step)]
    generator, meta = load_model(settings, demo_result["runs"]["train"], "cpu")
    codec, stride = StepCodec.from_meta(meta), meta["frame_stride"]
    frames = load_frames(settings.dataset_dir(meta["dataset"]), infer.data.params["rollout_simulation"])  # (T, 4, H, W)
    mask = frames[0, 3] > 0.5

    def predict(state):  # (4, H, W) physical -> (3, H, W) physical
        with torch.no_grad():
            out = codec.next_state(state, generator(torch.from_numpy(codec.norm.encode(state[None])))[0].numpy())
        out[:, mask] = 0.0
        return out

    state, fed_back, one_step = frames[0].copy(), [], []
    for n in range(1, len(logged) + 1):
        pred = predict(state)
        state = np.concatenate([pred, frames[0, 3:4]])
        fed_back.append(relative_l2(pred[0], frames[n * stride, 0]))
        one_step.append(relative_l2(predict(frames[(n - 1) * stride])[0], frames[n * stride, 0]))
    # the generator logged as an MLflow model, normalisation inside, makes the same first step from
    # physical units (before the obstacle's cells are zeroed)
    import mlflow.pytorch

    train = client.get_run(demo_result["runs"]["train"])
    surrogate = mlflow.pytorch.load_model(train.data.tags["karman.model_uri"], dst_path=tempfile.mkdtemp(dir=workdir))
    with torch.no_grad():
        step = surrogate(torch.from_numpy(frames[:1].astype(np.float32)))[0].numpy()
    expected = codec.next_state(frames[0], generator(torch.from_numpy(codec.norm.encode(frames[:1])))[0].detach().numpy())
    np.testing.assert_allclose(step, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    logged_models = client.search_logged_models([train.info.experiment_id], filter_string=f"source_run_id = '{train.info.run_id}'")
    assert [m.name for m in logged_models] == ["generator"]
    assert {d.dataset.name for d in train.inputs.dataset_inputs} == {"tiny"}

    replay_gap = np.abs(np.subtract(fed_back, logged)).max()
    assert replay_gap <= 1e-4 * max(logged)
    assert one_step[0] == pytest.approx(logged[0], rel=1e-4)
    # from step 2 on, starting from the reference frame scores differently, far beyond the replay's gap
    assert np.abs(np.subtract(one_step[1:], logged[1:])).max() > max(20 * replay_gap, 1e-6)


def test_generate_rerun_reuses_the_dataset(demo_result, workdir):
    from flows import pipeline

    manifest = workdir / "data" / "datasets" / "tiny" / "manifest.json"
    before = json.loads(manifest.read_text())
    again = pipeline.generate(TINY.generate)
    assert again["digest"] == demo_result["dataset"]["digest"]
    assert json.loads(manifest.read_text())["simulations"] == before["simulations"]
    groups = sorted(p.name for p in (workdir / "data" / "datasets" / "tiny" / "store.zarr").iterdir() if p.is_dir())
    assert groups == sorted(before["simulations"])


def mlflow_links(artifacts) -> list:
    """The link artifacts to MLflow runs among a flow run's artifacts (Prefect 3 stores a link artifact
    with type markdown: its data is the link in Markdown)."""
    return [a for a in artifacts if (a.key or "").startswith("mlflow-")]


@task(task_run_name="open a linked run")
def open_run_in_task() -> str:
    with mlflow_run(Settings.from_env(), "linktest", "link-task", description="A run opened by a task.") as run:
        pass
    return run.run_id


@flow(name="linked-runs", flow_run_name="linked runs")
def linked_runs() -> dict:
    child = run_child("rollout", "tests.tasks.common.job_bodies:open_run", {}, logging.getLogger("karman.test"))
    return {"flow_run": str(FlowRunContext.get().flow_run.id), "task": open_run_in_task(), **child}


def test_runs_opened_by_a_flow_run_and_its_child_job_link_to_it_and_it_links_back(workdir, prefect_harness):
    """Linked runs: an MLflow run opened in a flow run, or in a child job of one, carries the flow run's id and
    page (tags and a link in its note), and the flow run has a link artifact to its MLflow run."""
    result = linked_runs()
    flow_run = result["flow_run"]
    page = f"{PREFECT_UI_URL.value()}/runs/flow-run/{flow_run}"
    assert page.startswith("http")
    client = MlflowClient()
    for run_id, said in ((result["task"], "A run opened by a task."), (result["run_id"], "A run opened by a child job.")):
        tags = client.get_run(run_id).data.tags
        assert tags["prefect.flow_run_id"] == flow_run and tags["prefect.flow_run_url"] == page
        assert tags["mlflow.note.content"] == f"{said}\n\nPrefect flow run: [linked runs ({flow_run})]({page})"
    assert result["prefect_loaded"] is False  # the child learnt its flow run from the environment

    with get_client(sync_client=True) as prefect:
        artifacts = prefect.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run])))
    links = mlflow_links(artifacts)
    # the task's run (a child job has no Prefect to make one: in the pipeline, a child reports to a run its flow opened and linked)
    assert [a.key for a in links] == ["mlflow-linktest"]
    run = client.get_run(result["task"])
    assert f"({LOCAL_MLFLOW_UI}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}?workflowType=machine_learning)" in links[0].data
    assert "mlflow ui --backend-store-uri sqlite:///" in links[0].description
