"""Training end to end through the CLI: CPU, DDP, SPMD, sweeps, resume and failures.

Training end to end through the CLI, as a user runs it: CPU, DDP over two CPU processes, SPMD over
two virtual XLA CPU devices, a sweep with its study table, resume after SIGTERM and SIGKILL past validated epochs, and a NaN stop.
Real zarr datasets (written by the simulation task), a real MLflow store, real child processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from mlflow.tracking import MlflowClient

from models.schedule import lr_factor
from tasks.common.runtimes.data import epoch_order
from tasks.common.records import RECORD_FILE
from tasks.common.stores.store import STORE, Manifest, consolidate
from tasks.workloads.karman.simulate import run_simulation
from tasks.workloads.karman.data import split_of
from tests.conftest import ROOT, XLA_CPU_ENV, run_cli, run_in_process
from tests.flows.test_cli import assert_refused
from tests.tasks.train.interrupt import assert_same_result, stop_after_epoch, trained
from tests.tasks.common.test_store import tiny_spec

NET = ("--ngf", "8", "--ndf", "8", "--threads", "1")


@pytest.fixture(scope="module")
def dataset_root(tmp_path_factory):
    """A data root holding dataset 'tiny': three simulations of 12 frames on a 64 x 32 channel."""
    root = tmp_path_factory.mktemp("train-data")
    ds_dir = root / "datasets" / "tiny"
    manifest = Manifest(ds_dir, {"purpose": "training tests"})
    for re in (40.0, 50.0, 60.0):
        spec = tiny_spec(nx=64, ny=32, cx=12.0, cy=16.25, size=6.0, reynolds=re, frames=12, frame_every=20, backend="numpy")
        manifest.add(spec.sim_id, run_simulation(str(ds_dir), spec))
    consolidate(ds_dir)
    return root


@pytest.fixture
def trainable(workdir, dataset_root):
    shutil.copytree(dataset_root / "datasets", workdir / "data" / "datasets")
    return workdir


def client() -> MlflowClient:
    return MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])


def train(workdir, *args, env=None):
    """``trained`` on the dataset 'tiny'."""
    return trained(workdir, "--dataset", "tiny", *args, env=env)


def generator_state(workdir, run_id) -> dict:
    return torch.load(workdir / "data" / "runs" / run_id / "model" / "generator.pt", weights_only=True)


def kill_after_first_checkpoint(workdir, *args, env=None, checkpoint: str = "checkpoint.pt") -> str:
    """Start a training run, SIGKILL it (and its children) once its first checkpoint exists; its run id."""
    runs = workdir / "data" / "runs"
    before = set(runs.glob(f"*/{checkpoint}")) if runs.exists() else set()
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "flows", "train", "--dataset", "tiny", *args], cwd=workdir, env=full_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            found = sorted(set(runs.glob(f"*/{checkpoint}")) - before) if runs.exists() else []
            if found:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                assert not (found[0].parent / "model").exists(), "the run finished before it could be interrupted"
                return found[0].parent.name
            assert proc.poll() is None, "training ended before its first checkpoint"
            time.sleep(0.01)
        raise AssertionError("no checkpoint within 600 s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def assert_same_weights(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


def as_the_previous_version_wrote_it(path: Path) -> None:
    """Rewrite a checkpoint's history with numpy's scalars where the previous version's loop kept them as they came
    (its validation scores: a shedding validation simulation's Strouhal error and correlation periods are numpy.float64),
    which the weights-only loader of that version refused. That version kept this one file, without digests."""
    from tasks.common.runtimes.checkpoint import digests_path, previous_path

    digests_path(path).unlink()
    previous_path(path).unlink()
    state = torch.load(path, weights_only=True)
    history = state["history"]
    assert history["validation"], "the checkpoint holds no validation"
    history["validation"] = {k: np.float64(v) for k, v in history["validation"].items()}
    history["samples"] = np.int64(history["samples"])
    torch.save(state, path)
    with pytest.raises(Exception, match="numpy"):
        torch.load(path, weights_only=True)


def test_cpu_run_stopped_and_killed_after_validated_epochs_resumes_to_the_uninterrupted_result(trainable):
    # The paper's recipe trains D; ndf 16 makes D's stride-1 layer 64 -> 128 channels, wide enough for its
    # Winograd path on CPU. Every epoch validates, so every checkpoint holds validation scores.
    args = ("--dataset", "tiny", "--recipe", "paper", "--ngf", "8", "--ndf", "16", "--threads", "1", "--epochs", "6", "--batch-sizes", "4",
            "--validate-every", "1")
    whole = trained(trainable, *args)
    killed = stop_after_epoch(trainable, args, 2, signal.SIGTERM)
    assert client().get_run(killed).info.status == "KILLED"
    # a resume is refused if its options contradict the run (checked before anything is touched)
    assert_refused(run_in_process("train", "--resume", killed, "--epochs", "3", cwd=trainable), "--epochs 3 differs from the run being resumed (6)")
    stop_after_epoch(trainable, ("--resume", killed), 4, signal.SIGKILL)
    assert client().get_run(killed).info.status == "RUNNING"  # SIGKILL left no chance to close it
    as_the_previous_version_wrote_it(trainable / "data" / "runs" / killed / "checkpoint.pt")
    resumed = train(trainable, "--resume", killed)
    assert resumed["run_id"] == killed and resumed["epochs"] == 6
    assert_same_weights(generator_state(trainable, whole["run_id"]), generator_state(trainable, killed))
    assert_same_result(killed, whole["run_id"])
    run = client().get_run(killed)
    assert run.info.status == "FINISHED"
    assert sorted({m.step for m in client().get_metric_history(killed, "epoch_time_s")}) == list(range(1, 7))
    p, m = run.data.params, run.data.metrics
    assert (p["framework"], p["device"], p["world_size"], p["batch_size"], p["precision"]) == ("torch", "cpu", "1", "4", "fp32")
    assert p["image_height"] == "32" and p["image_width"] == "64" and p["code_version"].count("src:") == 1
    speed = json.loads(p["speed"])
    assert speed["winograd"] is True and speed["keep_freed_memory"] is True and speed["fused_adam"] is True
    assert {"forward_s", "backward_s", "optimizer_s", "data_wait_fraction", "peak_memory_mb", "warmup_s"} <= set(m)
    assert any(k.startswith("system/") for k in m), "no system metrics"
    assert {a.path for a in client().list_artifacts(killed)} >= {"model", "sample_predictions.png"}
    # a finished run is not resumed again
    assert_refused(run_in_process("train", "--resume", killed, cwd=trainable), "already finished")


def test_xla_spmd_on_two_virtual_devices_trains_and_resumes(trainable):
    args = (*NET, "--device", "xla", "--world-size", "2", "--epochs", "3", "--batch-sizes", "4")
    whole = train(trainable, *args, env=XLA_CPU_ENV)
    assert whole["strategy"] == "spmd" and whole["world_size"] == 2
    run = client().get_run(whole["run_id"])
    assert run.data.params["world_size"] == "2" and run.data.params["strategy"] == "spmd"
    compiled = [m.value for m in sorted(client().get_metric_history(whole["run_id"], "xla_compilations"), key=lambda m: m.step)]
    assert len(compiled) == 3 and compiled[0] > 0
    assert compiled[-1] == compiled[1], f"recompiling after warm-up: {compiled}"  # fixed shapes: one step graph
    assert np.isfinite(whole["final_l1"])
    # the host CPU's quick ceiling is a CPU-sized product (an accelerator's 8192 would take tens of seconds)
    record = json.loads(Path(client().download_artifacts(whole["run_id"], RECORD_FILE, str(trainable))).read_text())
    assert ", n=2048" in record["utilisation"]["ceiling_source"], record["utilisation"]
    killed = kill_after_first_checkpoint(trainable, *args, env=XLA_CPU_ENV)
    train(trainable, "--resume", killed, env=XLA_CPU_ENV)
    assert_same_weights(generator_state(trainable, whole["run_id"]), generator_state(trainable, killed), atol=1e-5)


def test_a_sweep_over_two_ddp_cpu_processes_builds_the_study_table(trainable):
    temporary = trainable / "temporary"  # the folder for temporary files of the command's children (TMPDIR)
    temporary.mkdir()
    out = train(trainable, *NET, "--world-size", "2", "--epochs", "2", "--batch-sizes", "2,4", env={"TMPDIR": str(temporary)})
    assert list(temporary.iterdir()) == []  # nothing of the jobs is left (under torchrun neither: tests/tasks/common/test_warm.py)
    parent = client().get_run(out["parent_run_id"])
    assert parent.data.tags["karman.stage"] == "train-sweep" and parent.info.status == "FINISHED"
    children = [client().get_run(r["run_id"]) for r in out["runs"]]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert {(c.data.params["batch_size"], c.data.params["strategy"], c.data.params["world_size"]) for c in children} == {("2", "ddp", "2"), ("4", "ddp", "2")}
    table = json.loads(Path(client().download_artifacts(parent.info.run_id, "study_table.json", str(trainable))).read_text())
    assert sorted(r["batch_size"] for r in table) == [2, 4]
    assert max(r["speedup"] for r in table) >= 1.0 and min(r["speedup"] for r in table) == pytest.approx(1.0)
    assert {"time_per_epoch_s_b2", "time_per_epoch_s_b4"} <= set(parent.data.metrics)


def test_a_loss_turning_nan_stops_the_run_and_keeps_the_last_good_checkpoint(trainable):
    # Spoil one obstacle-mask frame that epoch 1 drops (the remainder after full batches) and epoch 2 uses.
    ds_dir = trainable / "data" / "datasets" / "tiny"
    split = split_of(json.loads((ds_dir / "manifest.json").read_text()), 0, 1, 0)
    pairs_per_sim, batch = 11, 4  # 12 frames, stride 1, one-step loss
    n = pairs_per_sim * len(split["train"])
    dropped_1 = set(epoch_order(n, 0, 1)[(n // batch) * batch :])
    used_2 = set(epoch_order(n, 0, 2)[: (n // batch) * batch])
    j = min(dropped_1 & used_2)
    sim, t = split["train"][j // pairs_per_sim], j % pairs_per_sim
    group = zarr.open_group(str(ds_dir / STORE / sim), mode="r+")
    mask = group["mask"][t]
    group["mask"][t] = np.full_like(mask, 3e38)  # finite, so the data check passes it; encoded, it overflows to inf
    proc = run_in_process("train", "--dataset", "tiny", *NET, "--epochs", "3", "--batch-sizes", str(batch), "--val-simulations", "0",
                          "--unroll", "1", cwd=trainable)
    assert proc.returncode == 1
    last = next(line for line in proc.stderr.splitlines() if line.startswith("python -m flows train: failed:"))
    assert "loss became non-finite at epoch 2" in last and "last good checkpoint (epoch 1) is kept" in last
    run_dir = next(p for p in (trainable / "data" / "runs").iterdir() if p.is_dir())  # (beside it: the run's writer lock)
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["history"]["epoch"] == 1
    run = client().get_run(run_dir.name)
    assert run.info.status == "FAILED" and "non-finite" in run.data.tags["karman.error"]
    # a corrupt checkpoint is refused on resume, and left as it was
    (run_dir / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert_refused(run_in_process("train", "--resume", run_dir.name, cwd=trainable), "is damaged", "start the run afresh")
    assert (run_dir / "checkpoint.pt").read_bytes() == b"not a checkpoint"


@pytest.mark.parametrize(
    "args, env, fragments",
    [
        (("--depth", "6"), None, ("image size 32x64 does not fit a U-Net of depth 6", "multiples of 64")),
        (("--batch-sizes", "3", "--world-size", "2"), None, ("batch size 3 does not split evenly over 2 devices",)),
        (("--world-size", "64"), None, ("world size 64 exceeds the",)),
        (("--device", "xla"), None, ("device xla requested", "TPU runtime did not start")),
        (("--resume", "0" * 32), None, ("unknown run '" + "0" * 32 + "'",)),
        (("--seed", "-1"), None, ("--seed: Input should be greater than or equal to 0",)),
        (("--epochs", "100000000"), None, ("--epochs: Input should be less than or equal to 100000",)),
        (("--threads", "4096"), None, ("--threads 4096 exceeds the", "CPU cores of this host")),
        (("--ngf", "1024", "--ndf", "1024"), None, ("ngf 1024 and ndf 1024 at batch 8 need about", "GiB a device", "use narrower networks")),
        (("--stop-at-target", "--target-steps", "6", "--validate-steps", "10", "--frame-stride", "2"), None,
         ("target_steps 6 exceeds the 5 steps of frame stride 2 that the shortest validation simulation", "use --target-steps 5 or less")),
    ],
)
def test_bad_training_input_is_refused_with_one_line(trainable, args, env, fragments):
    # (PJRT_DEVICE unset: xla means the TPU runtime, absent here)
    assert_refused(run_in_process("train", "--dataset", "tiny", *NET, *args, cwd=trainable, env=env), *fragments)


def test_a_dataset_without_simulations_is_refused(workdir):
    ds_dir = workdir / "data" / "datasets" / "empty"
    ds_dir.mkdir(parents=True)
    (ds_dir / "manifest.json").write_text('{"spec": {}, "simulations": {}, "digest": "x"}')
    assert_refused(run_in_process("train", "--dataset", "empty", cwd=workdir), "dataset 'empty' has no completed simulations")


def test_a_time_budget_ends_training_at_the_step_that_crosses_it_and_saves_that_model(trainable):
    out = train(trainable, *NET, "--time-budget", "4", "--batch-sizes", "2", "--validate-every", "0")
    assert 4.0 <= out["train_time_s"] < 4.0 + 10 * out["time_per_epoch_s"] + 2.0  # stopped within a step of the budget
    assert 1 <= out["epochs"] < 10**9 and out["target_reached"] == 0.0
    assert out["samples_seen"] == out["steps"] * 2
    run = client().get_run(out["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["karman.target"] == "not reached"
    assert (trainable / "data" / "runs" / out["run_id"] / "model" / "generator.pt").exists()
    state = torch.load(trainable / "data" / "runs" / out["run_id"] / "checkpoint.pt", weights_only=True)
    assert_same_weights(state["model"]["generator"], generator_state(trainable, out["run_id"]))  # the model of that moment
    assert state["history"]["global_step"] == out["steps"]  # the loop's count, kept with the model


def test_validation_rollouts_score_quality_over_training_time_and_record_time_to_target(trainable):
    # A target every model meets (vorticity error <= 1e6 for 2 steps): reached at the first validation.
    out = train(trainable, *NET, "--epochs", "6", "--batch-sizes", "4", "--validate-every", "2", "--validate-steps", "3",
                "--target-vorticity", "1e6", "--target-steps", "2", "--stop-at-target")
    assert out["target_reached"] == 1.0 and out["epochs"] == 2 and out["epochs_to_target"] == 2
    assert out["samples_to_target"] == out["samples_seen"] == out["steps"] * 4
    assert 0 < out["time_to_target_s"] <= out["train_time_s"]
    history = client().get_metric_history(out["run_id"], "val_horizon_vorticity")
    assert [(m.step, m.value) for m in history] == [(2, 3.0)]
    wall = client().get_metric_history(out["run_id"], "train_time_s")
    assert sorted(m.step for m in wall if m.step > 0) == [1, 2] and wall[-1].value > 0  # step 0: the summary
    assert client().get_run(out["run_id"]).data.tags["karman.target"] == "reached"
    # its MLPerf-format log: the vorticity horizon as the eval score, run_stop a success, MLCommons' checker passes it
    from tasks.common.runtimes.mlperf import compliance

    log = Path(client().download_artifacts(out["run_id"], "mlperf/mllog.txt", str(trainable)))
    events = [json.loads(line.removeprefix(":::MLLOG ")) for line in log.read_text().splitlines()]
    evals = [(e["metadata"]["epoch_num"], e["metadata"]["metric"], e["value"]) for e in events if e["key"] == "eval_accuracy"]
    assert evals == [(2, "horizon_vorticity", 3.0)] and events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "success"
    assert compliance(log) == []
    # A target no model meets: every validation is logged, training runs all its epochs, "not reached".
    missed = train(trainable, *NET, "--epochs", "3", "--batch-sizes", "4", "--validate-every", "2", "--validate-steps", "3",
                   "--target-vorticity", "1e-9", "--target-steps", "1", "--stop-at-target")
    assert missed["epochs"] == 3 and missed["target_reached"] == 0.0 and "time_to_target_s" not in missed
    # The default recipe's cosine schedule runs over the epoch limit: the rate of each epoch's last step.
    steps_per_epoch = missed["steps"] // 3
    rates = sorted((m.step, m.value) for m in client().get_metric_history(missed["run_id"], "learning_rate"))
    expected = [1e-3 * lr_factor("cosine", (e * steps_per_epoch - 1) / (3 * steps_per_epoch)) for e in (1, 2, 3)]
    assert [s for s, _ in rates] == [1, 2, 3] and [v for _, v in rates] == pytest.approx(expected, rel=1e-6)
    assert sorted(m.step for m in client().get_metric_history(missed["run_id"], "val_one_step_rel_l2_vorticity")) == [2, 3]
    # Each epoch's samples/s is epoch_samples_per_s; samples_per_s, the run's one value that MLflow shows,
    # is its samples per epoch over its s/epoch (the median epoch after the first).
    assert sorted(m.step for m in client().get_metric_history(missed["run_id"], "epoch_samples_per_s")) == [1, 2, 3]
    assert [m.step for m in client().get_metric_history(missed["run_id"], "samples_per_s")] == [0]
    assert client().get_run(missed["run_id"]).data.metrics["samples_per_s"] == pytest.approx(missed["samples_per_s"])


def test_a_target_longer_than_the_validation_rollout_is_refused(trainable):
    assert_refused(run_in_process("train", "--dataset", "tiny", *NET, "--target-steps", "80", "--validate-steps", "60", cwd=trainable),
                   "target_steps 80 exceeds validate_steps 60")


def test_the_schedules_progress_runs_over_the_time_budget_else_over_the_epoch_limit():
    from tasks.common.specs import TrainSpec

    assert TrainSpec(time_budget=200.0).progress(50.0, 7, 10) == 0.25
    assert TrainSpec(epochs=4).progress(999.0, 10, 10) == 0.25
    assert TrainSpec().progress(0.0, 15, 10) == 0.5  # no budget, no epochs: the default 3 epochs


def test_an_epoch_reports_its_progress_step_by_step(trainable):
    """Within an epoch the run says how far it is (here after every step; by default every 10 s)."""
    import re

    proc = run_cli("train", "--dataset", "tiny", *NET, "--epochs", "2", "--batch-sizes", "2", "--validate-every", "0", "--json",
                   cwd=trainable, env={"KARMAN_PROGRESS_EVERY_S": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = [re.search(r"epoch (\d): step (\d+)/(\d+); (\d+)% done", line) for line in (proc.stdout + proc.stderr).splitlines()]
    found = [(int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))) for m in found if m]
    steps = found[0][2]
    assert [(e, s) for e, s, _, _ in found] == [(e, s) for e in (1, 2) for s in range(1, steps)]  # the epoch's own line ends it
    assert [p for *_, p in found] == sorted(p for *_, p in found) and found[-1][3] < 100


def test_ablate_trains_a_variant_per_seed_and_scores_its_rollouts_on_the_extra_dataset(trainable):
    """ablate with an extra dataset (here one simulation at a Reynolds number no run trained on): each model is
    rolled out on the test simulation and on every simulation of the extra dataset, whose scores fill the
    row's long_ columns (the worst over them: tests/tasks/report/test_ablation.py)."""
    extra = trainable / "data" / "datasets" / "tiny-extra"
    manifest = Manifest(extra, {"purpose": "ablation test"})
    sim = tiny_spec(nx=64, ny=32, cx=12.0, cy=16.25, size=6.0, reynolds=45.0, frames=12, frame_every=20, backend="numpy")
    manifest.add(sim.sim_id, run_simulation(str(extra), sim))
    consolidate(extra)
    proc = run_in_process("ablate", "--dataset", "tiny", "--variants", "constrained", "--seed", "5", "--time-budget", "1",
                          "--ngf", "8", "--threads", "1", "--steps", "4", "--extra-dataset", "tiny-extra", "--extra-steps", "3",
                          "--name", "abl", "--json", cwd=trainable)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    assert (row["variant"], row["seed"]) == ("constrained", 5)
    text = (trainable / "data" / "reports" / "abl" / "ablation.md").read_text()
    assert f"3 steps on every simulation of dataset `tiny-extra` ({sim.sim_id})" in text and "long_horizon_vorticity" in text
    runs = client().search_runs([client().get_experiment_by_name("test").experiment_id], "tags.`karman.stage` = 'infer'")
    (long,) = [r for r in runs if r.data.params["rollout_simulation"] == sim.sim_id]
    assert long.data.params["rollout_steps"] == "3"
    assert row["long_horizon_vorticity"] == long.data.metrics["horizon_vorticity"]
    trained = client().get_run(long.data.params["model_run_id"])
    assert trained.data.params["recipe_constrain"] == "True" and trained.data.params["seed"] == "5"
    # the constrained model's rollouts hold the inlet though the rollout spec did not ask (its own hold_inflow stays False)
    assert (long.data.params["hold_inflow"], long.data.params["inflow_held"]) == ("False", "True")


def test_ablate_refuses_a_missing_extra_dataset_before_it_trains(trainable):
    assert_refused(run_in_process("ablate", "--dataset", "tiny", "--variants", "default", "--extra-dataset", "nowhere", cwd=trainable),
                   "dataset 'nowhere' not found")
    assert not (trainable / "data" / "runs").exists() or not any((trainable / "data" / "runs").iterdir())
