"""Rollouts through the CLI, full-frame and map-reduce, scored against the reference frames.

Rollouts through the CLI, as a user runs them: full-frame and map-reduce on CPU and on two virtual
XLA CPU devices (SPMD), scored against the reference frames; bad requests refused before any work.
A real zarr dataset, a real training run in a real MLflow store, real child processes."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tasks.common.stores.store import Manifest, consolidate
from tasks.workloads.karman.simulate import run_simulation
from tests.conftest import ROOT, XLA_CPU_ENV, run_in_process, strict_json
from tests.flows.test_cli import assert_refused
from tests.tasks.common.test_store import tiny_spec


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A working folder with dataset 'tiny' (three 32 x 64 simulations of 16 frames) and one finished
    training run of a narrow U-Net (depth 5: tiles are multiples of 32); (folder, environment, run id)."""
    root = tmp_path_factory.mktemp("rollout")
    env = {"KARMAN_DATA_ROOT": str(root / "data"), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
           "KARMAN_ARTIFACT_ROOT": str(root / "mlartifacts"), "KARMAN_EXPERIMENT": "rollout-tests"}
    ds_dir = root / "data" / "datasets" / "tiny"
    manifest = Manifest(ds_dir, {"purpose": "rollout tests"})
    for re in (40.0, 50.0, 60.0):
        spec = tiny_spec(nx=64, ny=32, cx=12.0, cy=16.25, size=6.0, reynolds=re, warmup_steps=600, frames=16, frame_every=20, backend="numpy")
        manifest.add(spec.sim_id, run_simulation(str(ds_dir), spec))
    consolidate(ds_dir)
    proc = run_in_process("train", "--dataset", "tiny", "--ngf", "8", "--ndf", "8", "--threads", "1", "--epochs", "2",
                   "--batch-sizes", "4", "--json", cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, env, json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]


def infer(trained, *args, env=None) -> dict:
    root, base_env, run_id = trained
    proc = run_in_process("infer", "--model-run", run_id, "--steps", "6", *args, "--json", cwd=root, env={**base_env, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return strict_json(proc.stdout.strip().splitlines()[-1])


def client(trained) -> MlflowClient:
    return MlflowClient(tracking_uri=trained[1]["MLFLOW_TRACKING_URI"])


@pytest.fixture(scope="module")
def cpu_full(trained):
    return infer(trained, "--mode", "full")


def test_full_and_mapreduce_rollouts_on_cpu_are_scored_and_logged(trained, cpu_full):
    tiled = infer(trained, "--mode", "mapreduce", "--workers", "2", "--tile", "32", "--halo", "8")
    assert cpu_full["tiles"] == 1 and tiled["tiles"] == 3 and tiled["workers"] == 2
    for result in (cpu_full, tiled):
        assert result["steps"] == 6 and result["frames_per_s"] > 0 and result["solver_frames_per_s"] > 0
        assert result["cold_step_s"] >= result["warm_step_s"] * 0.5
        assert np.isfinite(result["final_rel_l2_vorticity"])
    # a narrow net trained for two epochs is no oracle, but tiling it changes its output only a little
    assert 0 < tiled["seam_rel_error"] < 0.5
    run = client(trained).get_run(tiled["run_id"])
    assert run.data.params["tile_shape"] == "32x32" and run.data.params["tiles"] == "3"
    assert run.data.tags["karman.workers"] == "2"
    metrics = run.data.metrics
    for name in ("frames_per_s", "latency_split_s", "latency_compute_s", "latency_merge_s", "latency_transfer_s",
                 "seam_rel_error", "solver_frames_per_s", "surrogate_vs_solver", "compile_s"):
        assert name in metrics, name
    # six steps are less than two shedding periods: no Strouhal number, and the verdict says why
    assert "strouhal_ref" not in metrics and "strouhal_pred" not in metrics
    assert cpu_full["correlation_periods"] is None and tiled["strouhal_pred"] is None  # NaN, written as null in strict JSON
    # the phase and shape diagnostics and the anchors' metrics, as far as six steps reach
    for name in ("horizon_vorticity_lowpass", "band_error_high_final", "mgn_rmse_1", "correlation_time"):
        assert name in metrics, name
    assert "acdm_mse_60" not in metrics and "mgn_rmse_50" not in metrics and cpu_full["acdm_mse_60"] is None
    curve = client(trained).get_metric_history(tiled["run_id"], "rel_l2_vorticity_lowpass")
    assert sorted(m.step for m in curve) == list(range(1, 7)) and len(cpu_full["vorticity_lowpass"]) == 6
    assert "too short to measure the shedding period" in run.data.params["verdict"]
    history = client(trained).get_metric_history(tiled["run_id"], "step_seam_rel_error")
    assert [m.step for m in history] == [1, 2, 3, 4, 5, 6]
    artifacts = {a.path for a in client(trained).list_artifacts(tiled["run_id"])}
    assert {"rollout.gif", "rollout_error.png", "vorticity_rollout.png"} <= artifacts
    gif = Path(client(trained).download_artifacts(tiled["run_id"], "rollout.gif", tempfile.mkdtemp(dir=trained[0])))
    assert gif.read_bytes()[:6] == b"GIF89a"


@pytest.mark.full  # one of the slowest of its module: the full tier runs it
def test_mapreduce_with_the_whole_frame_as_tile_reproduces_full_frame(trained, cpu_full):
    whole = infer(trained, "--mode", "mapreduce", "--workers", "2", "--tile", "32,64", "--halo", "4")
    assert whole["tiles"] == 1 and whole["seam_rel_error"] == 0.0
    np.testing.assert_allclose(whole["final_rel_l2_u"], cpu_full["final_rel_l2_u"], rtol=1e-6)


@pytest.mark.full  # minutes of XLA compilation or training
def test_rollouts_on_two_virtual_xla_devices_match_cpu(trained, cpu_full):
    full = infer(trained, "--device", "xla", "--mode", "full", env=XLA_CPU_ENV)
    sharded = infer(trained, "--device", "xla", "--mode", "mapreduce", "--workers", "2", "--tile", "32,64", env=XLA_CPU_ENV)
    tiled = infer(trained, "--device", "xla", "--mode", "mapreduce", "--workers", "2", "--tile", "32", "--halo", "8", env=XLA_CPU_ENV)
    for result in (full, sharded):
        np.testing.assert_allclose(result["final_rel_l2_u"], cpu_full["final_rel_l2_u"], rtol=1e-3)
        np.testing.assert_allclose(result["mean_rel_l2_u"], cpu_full["mean_rel_l2_u"], rtol=1e-3)
    assert sharded["seam_rel_error"] < 1e-5  # one tile padded to a group per device: full-frame, sharded
    assert tiled["tiles"] == 3 and 0 < tiled["seam_rel_error"] < 0.5
    run = client(trained).get_run(tiled["run_id"])
    assert "SPMD" in run.data.params["device_name"]


def _model_with_three_inputs(trained) -> str:
    """A finished training run whose model takes u, v, p only (no mask): the tiny run's model files
    with its metadata changed, logged as a new run in the same store."""
    root, env, run_id = trained
    mlflow = client(trained)
    source = Path(mlflow.download_artifacts(run_id, "model", tempfile.mkdtemp(dir=trained[0])))
    meta = json.loads((source / "meta.json").read_text())
    meta["net"]["in_channels"], meta["inputs"] = 3, ["u", "v", "p"]
    (source / "meta.json").write_text(json.dumps(meta))
    original = mlflow.get_run(run_id)
    run = mlflow.create_run(original.info.experiment_id, tags={k: v for k, v in original.data.tags.items() if k.startswith("karman.")})
    mlflow.log_artifacts(run.info.run_id, str(source), "model")
    mlflow.set_terminated(run.info.run_id)
    return run.info.run_id


@pytest.mark.parametrize("args, fragments", [
    (("--mode", "mapreduce", "--tile", "64"), ("tile height 64 is larger than the frame's height 32",)),
    (("--mode", "mapreduce", "--tile", "32", "--halo", "16"), ("halo 16 leaves no core in a tile width of 32",)),
    (("--mode", "mapreduce", "--tile", "48"), ("tile height 48 is not a positive multiple of 32",)),
    (("--mode", "mapreduce", "--workers", "4096"), ("4096 workers requested but this host has",)),
    (("--mode", "full", "--workers", "2"), ("full-frame runs on one worker",)),
    (("--simulation", "nope"), ("simulation 'nope' is not in dataset 'tiny'",)),
])
def test_bad_rollout_requests_are_refused_before_any_run(trained, args, fragments):
    root, env, run_id = trained
    before = len(client(trained).search_runs([client(trained).get_experiment_by_name("rollout-tests").experiment_id]))
    assert_refused(run_in_process("infer", "--model-run", run_id, *args, cwd=root, env=env), *fragments)
    after = len(client(trained).search_runs([client(trained).get_experiment_by_name("rollout-tests").experiment_id]))
    assert after == before  # nothing started


def test_unknown_model_runs_and_models_with_other_channels_are_refused(trained):
    root, env, _ = trained
    assert_refused(run_in_process("infer", "--model-run", "f" * 32, cwd=root, env=env), "unknown model run")
    other = _model_with_three_inputs(trained)
    assert_refused(run_in_process("infer", "--model-run", other, cwd=root, env=env),
                   f"model run {other} maps 3 channels (u, v, p)", "dataset 'tiny' gives 4 (u, v, p, mask), or 5 with each simulation's Reynolds")


def test_infer_rolls_out_models_of_workloads_with_rollouts_only(trained, monkeypatch):
    """A finished training run of a workload whose models are not rolled out (digits) is refused by name, in one line;
    'latest' passes over it to the newest run of a workload with rollouts (the infer stage asks the workload table)."""
    from tasks.common.config.errors import UserError
    from tasks.common.tracking.names import Tag
    from tasks.common.config.settings import Settings
    from tasks.common.specs import InferSpec
    from tasks.infer.plan import plan_rollout, rolled_model

    root, env, run_id = trained
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    c = client(trained)
    experiment = c.get_experiment_by_name("rollout-tests").experiment_id
    newest_karman = c.search_runs([experiment], f"tags.`{Tag.STAGE}` = 'train' and attributes.status = 'FINISHED'",
                                  order_by=["attributes.start_time DESC"], max_results=1)[0].info.run_id
    digits = c.create_run(experiment, run_name="digits-torch-cpu-b64",
                          tags={Tag.STAGE: "train", Tag.WORKLOAD: "digits"}).info.run_id
    try:
        c.set_terminated(digits, "FINISHED")  # the newest finished training run of the experiment
        with pytest.raises(UserError, match=f"training run {digits} trained workload digits, whose models are not rolled out; "
                                            "infer rolls out models of karman"):
            plan_rollout(Settings.from_env(), InferSpec(model_run=digits, mode="full"), None)
        workload, model = rolled_model(Settings.from_env(), "latest")
        assert (workload.name, model.info.run_id) == ("karman", newest_karman)
    finally:
        c.delete_run(digits)


def test_a_model_conditioned_on_the_reynolds_number_rolls_out_with_each_simulations_own(trained):
    """--condition reynolds: the model's fifth input holds the rolled-out simulation's Reynolds number (the training
    range mapped onto [-1, 1]); full-frame and map-reduce rollouts take it, and so does the logged MLflow model."""
    root, env, _ = trained
    proc = run_in_process("train", "--dataset", "tiny", "--ngf", "8", "--ndf", "8", "--threads", "1", "--epochs", "1",
                          "--batch-sizes", "4", "--condition", "reynolds", "--validate-every", "0", "--json", cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    meta = json.loads(Path(client(trained).download_artifacts(run_id, "model/meta.json", str(root))).read_text())
    assert meta["inputs"] == ["u", "v", "p", "mask", "reynolds"] and meta["net"]["in_channels"] == 5
    train_re = meta["train_reynolds"]
    assert meta["normalizer"]["reynolds"] == pytest.approx([(max(train_re) + min(train_re)) / 2, max((max(train_re) - min(train_re)) / 2, 1.0)])
    full = infer((root, env, run_id), "--mode", "full")
    tiled = infer((root, env, run_id), "--mode", "mapreduce", "--workers", "1")
    assert np.isfinite(full["final_rel_l2_vorticity"]) and np.isfinite(tiled["final_rel_l2_vorticity"])
    import mlflow.pytorch
    import torch

    with pytest.MonkeyPatch.context() as patch:  # the store for this load only: mlflow.set_tracking_uri would outlive the test
        patch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
        surrogate = mlflow.pytorch.load_model(f"runs:/{run_id}/generator", dst_path=tempfile.mkdtemp(dir=root))
    state = torch.zeros(1, 5, 32, 64)
    state[:, 0] = 0.05
    outs = []
    for re in (min(train_re), min(train_re) + 30):
        state[:, 4] = re
        with torch.no_grad():
            outs.append(surrogate(state))
    assert float((outs[0] - outs[1]).abs().max()) > 0  # the Reynolds number reaches the network


@pytest.mark.full  # minutes of XLA compilation or training
def test_a_model_trained_on_crops_tiles_at_its_crop_side_by_default(trained):
    """--crop 32 trains a depth-5 U-Net on random 32 x 32 crops of the 32 x 64 frames; its map-reduce
    rollout takes tiles of the trained side without being told, and full-frame still works."""
    root, env, _ = trained
    proc = run_in_process("train", "--dataset", "tiny", "--ngf", "8", "--ndf", "8", "--threads", "1", "--epochs", "2",
                   "--batch-sizes", "4", "--crop", "32", "--json", cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    params = client(trained).get_run(run_id).data.params
    assert (params["crop"], params["generator_depth"], params["image_height"], params["image_width"]) == ("32", "5", "32", "64")
    tiled = infer((root, env, run_id), "--mode", "mapreduce", "--workers", "1")
    assert tiled["tiles"] == 3 and np.isfinite(tiled["final_rel_l2_vorticity"]) and 0 <= tiled["seam_rel_error"] < 1
    assert client(trained).get_run(tiled["run_id"]).data.params["tile_shape"] == "32x32"
    full = infer((root, env, run_id), "--mode", "full")
    assert full["tiles"] == 1
    assert_refused(run_in_process("train", "--dataset", "tiny", "--crop", "16", "--depth", "5", cwd=root, env=env),
                   "crop 16: image size 16x16 does not fit a U-Net of depth 5")
    assert_refused(run_in_process("train", "--dataset", "tiny", "--crop", "64", cwd=root, env=env), "crop 64 does not fit the 32x64 frames; use at most 32")


FRAMEWORKS = ("torch", "torch_xla", "tensorflow", "keras", "jax")


def test_the_flow_process_plans_training_and_rollouts_without_importing_a_framework(trained):
    """The flows, the CLI and the parent-side planning of train and infer (dataset, devices, model run,
    channels, tiling, workers) run in a process that imports no ML framework: those live in the children. Importing the
    flows loads no data library either (zarr, xarray, pandas: about 1 s of each command's start); the plans load what
    they read."""
    root, env, run_id = trained
    script = f"""
import sys
import flows.cli, flows.pipeline
print(sorted(m for m in ("zarr", "xarray", "pandas") if m in sys.modules))
from tasks.common.config.settings import Settings
from tasks.common.specs import InferSpec, TrainSpec
from tasks.infer.plan import plan_rollout
from tasks.train.plan import plan_training
import logging
log = logging.getLogger("test")
settings = Settings.from_env()
train = plan_training(settings, TrainSpec(dataset="tiny", batch_sizes=[2, 4], ngf=8, ndf=8), log)
infer = plan_rollout(settings, InferSpec(model_run={run_id!r}, mode="mapreduce", workers=2, tile=[32], halo=8), log)
assert train.batch_sizes == [2, 4] and train.world == 1 and train.threads >= 1, train
assert infer.tiles.count == 3 and infer.full_frame is not None and infer.framework == "torch", infer
print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-2:] == ["[]", "[]"]


def test_a_rollout_plan_travels_to_the_job_as_json_unchanged(trained, monkeypatch):
    from tasks.common.config.settings import Settings
    from tasks.common.specs import InferSpec
    from tasks.infer.plan import plan_rollout
    from tasks.workloads.karman.infer.plan import RolloutPlan

    root, env, run_id = trained
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plan = plan_rollout(Settings.from_env(), InferSpec(model_run=run_id, mode="mapreduce", workers=2, tile=[32, 32], halo=8), None)
    again = RolloutPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again.to_json() == plan.to_json()
    assert again.tiles.offsets() == plan.tiles.offsets() and again.sim_spec == plan.sim_spec


def _offered(trained, digest: str | None, reached: bool, time_to_target: float | None, horizon: float | None) -> str:
    """A finished training run beside the real one: the real run's model (its artifacts and logged generator) under
    another record, so the registry compares scores the test chooses; its run id."""
    from tasks.common.records import RECORD_FILE, TrainRecord

    root, env, run_id = trained
    c = client(trained)
    real = c.get_run(run_id)
    record = TrainRecord.model_validate_json(Path(c.download_artifacts(run_id, RECORD_FILE, tempfile.mkdtemp(dir=trained[0]))).read_text())
    summary = record.summary.model_copy(update={"target_reached": reached, "time_to_target_s": time_to_target,
                                                "validation": {**record.summary.validation, "horizon_vorticity": horizon}})
    config = record.config.model_copy(update={"dataset_digest": digest or record.config.dataset_digest})
    run = c.create_run(real.info.experiment_id, tags={**real.data.tags, "mlflow.runName": "offered"})
    c.log_dict(run.info.run_id, record.model_copy(update={"summary": summary, "config": config}).model_dump(mode="json"), RECORD_FILE)
    c.log_artifacts(run.info.run_id, c.download_artifacts(run_id, "model", tempfile.mkdtemp(dir=trained[0])), "model")
    c.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def test_the_champion_alias_moves_only_to_a_better_model_on_the_same_data_and_target_and_infer_rolls_it_out(trained, monkeypatch):
    from tasks.workloads.karman.registry import register_champion
    from tasks.common.config.settings import Settings

    root, env, run_id = trained
    for key, value in {**env, "KARMAN_REGISTERED_MODEL": "surrogate-test"}.items():
        monkeypatch.setenv(key, value)
    settings = Settings.from_env()
    short = register_champion(settings, [_offered(trained, None, False, None, 6)])  # missed the target, 6 of 40 steps: no champion
    assert (short["version"], short["champion"]) == (None, False) and "fewer than 20 steps" in short["reason"]
    slow = _offered(trained, None, True, 50.0, None)  # reached, with no horizon measured: no tag says 'None'
    first = register_champion(settings, [_offered(trained, None, False, None, 6), slow])  # reached beats any horizon
    assert (first["version"], first["run_id"], first["champion"], first["reason"]) == (1, slow, True, "first champion")
    faster, other_data = _offered(trained, None, True, 20.0, 1), _offered(trained, "f" * 64, True, 1.0, 1)
    assert "None" not in client(trained).get_model_version("surrogate-test", "1").tags.values()
    assert register_champion(settings, [faster])["reason"] == "beats version 1 (reached the target in 50 s)"
    assert register_champion(settings, [faster])["reason"] == "it is the champion already"  # the same model, once
    kept = register_champion(settings, [other_data])  # registered, but not comparable with the champion
    assert (kept["version"], kept["champion"]) == (3, False) and "another dataset digest or target" in kept["reason"]
    worse = register_champion(settings, [_offered(trained, None, True, 30.0, 9)])
    assert (worse["champion"], worse["reason"]) == (False, "version 2 stays champion: reached the target in 20 s")
    version = client(trained).get_model_version_by_alias("surrogate-test", "champion")
    assert (int(version.version), version.run_id, version.tags["karman.score"]) == (2, faster, "reached the target in 20 s")
    assert version.tags["karman.dataset_digest"] != "f" * 64 and version.tags["karman.quality_target"].startswith("vorticity <= ")
    proc = run_in_process("infer", "--model", "models:/surrogate-test@champion", "--steps", "2", "--json", cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert strict_json(proc.stdout.strip().splitlines()[-1])["model_run_id"] == faster
    assert_refused(run_in_process("infer", "--model", "models:/surrogate-test@nobody", cwd=root, env=env), "has no models:/surrogate-test@nobody")


def test_a_diverging_run_fails_saying_why_and_is_neither_ranked_nor_registered(trained, monkeypatch):
    """A run injected beside the finished one with a learning rate a million times too large: its loss becomes non-finite
    within steps; the run is marked failed with that reason (its tag and the report's failed runs), the ranking and the
    registry pass it over, and the registry takes the finished model offered beside it."""
    from tasks.common.config.settings import Settings
    from tasks.workloads.karman.registry import register_champion

    root, env, run_id = trained
    proc = run_in_process("train", "--dataset", "tiny", "--ngf", "8", "--ndf", "8", "--threads", "1", "--epochs", "1",
                          "--batch-sizes", "4", "--lr", "1e6", "--json", cwd=root, env=env)
    assert proc.returncode != 0 and "loss became non-finite at epoch 1" in proc.stderr
    c = client(trained)
    (diverged,) = c.search_runs([c.get_run(run_id).info.experiment_id], "tags.`karman.recipe` LIKE '%lr=1000000.0%'")
    assert diverged.info.status == "FAILED" and diverged.data.tags["karman.error"].startswith("RunFailed: loss became non-finite")
    done = run_in_process("aggregate", "--runs", "all", "--name", "diverged", "--json", cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (root / "data" / "reports" / "diverged" / "report.md").read_text()
    failed = report.split("## Failed runs", 1)[1].split("\n## ", 1)[0]
    assert f"- {diverged.info.run_name} (`{diverged.info.run_id[:8]}`): RunFailed: loss became non-finite at epoch 1" in failed
    # listed among every training run as FAILED, and in none of the comparisons above them (its setting is not even shown)
    compared, every_run = report.split("### Every training run", 1)
    assert diverged.info.run_id[:8] not in compared and "lr=1000000.0" not in compared
    assert f"| `{diverged.info.run_id[:8]}` | karman | torch | cpu x1 | 4 |" in every_run and "| FAILED |" in every_run
    for key, value in {**env, "KARMAN_REGISTERED_MODEL": "surrogate-diverged"}.items():
        monkeypatch.setenv(key, value)
    offered = _offered(trained, None, True, 50.0, None)
    registered = register_champion(Settings.from_env(), [diverged.info.run_id, offered])
    assert (registered["version"], registered["run_id"], registered["champion"]) == (1, offered, True)
    assert [v.run_id for v in c.search_model_versions("name='surrogate-diverged'")] == [offered]
