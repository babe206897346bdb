"""The JAX version of karman's training and rollouts through the CLI.

As a user runs it: the jitted Pix2Pix step on one CPU device, the same MLflow names and parameter counts as a torch
run, the generator's arrays logged under torch's names, a map-reduce rollout of the model checked against the whole
frame's, and both runs in the report. Real zarr data, a real MLflow store, real child processes (jax trains in the
training job's child)."""

import json
from pathlib import Path

import numpy as np
import pytest

from tasks.common.tracking.names import Tag
from tests.conftest import run_in_process
from tests.tasks.train.test_training import NET, client, dataset_root, train, trainable  # noqa: F401

JAX = ("--framework", "jax")


def test_jax_trains_with_torchs_names_logs_its_generator_and_rolls_out_tiled_against_the_whole_frame(trainable):
    # a U-Net of depth 3 (the test's frames take 5): XLA's compilation of the whole step, not the steps, is most of a small run's time
    out = train(trainable, *JAX, *NET, "--depth", "3", "--epochs", "2", "--batch-sizes", "4", "--validate-every", "1")
    assert out["world_size"] == 1 and np.isfinite(out["final_l1"])
    run = client().get_run(out["run_id"])
    p, m = run.data.params, run.data.metrics
    assert run.info.status == "FINISHED" and run.data.tags[Tag.FRAMEWORK] == "jax" and run.info.run_name == "karman-jax-cpu-b4"
    assert (p["framework"], p["batch_size"], p["jax_version"]) == ("jax", "4", p["framework_version"])
    assert json.loads(p["speed"])["jit"] is True
    # the torch networks' parameter counts (ngf = ndf = 8, the default recipe's resize U-Net of depth 3)
    from models.karman.nets.config import NetConfig

    g, d = NetConfig(size=32, depth=3, ngf=8, ndf=8, upsample="resize", output="linear", dropout=0.0).weight_count()
    assert (p["generator_params"], p["discriminator_params"]) == (str(g), str(d))
    assert sorted(x.step for x in client().get_metric_history(out["run_id"], "epoch_time_s")) == [1, 2]
    assert {"step_loss_l1", "step_loss_l1_step2", "step_loss_l1_step3", "val_horizon_vorticity"} <= set(m) and m["samples_per_s"] > 0
    artifacts = {a.path for a in client().list_artifacts(out["run_id"], "model")}
    assert {"model/generator.npz", "model/meta.json"} <= artifacts
    model_dir = trainable / "data" / "runs" / out["run_id"] / "model"
    meta = json.loads((model_dir / "meta.json").read_text())
    assert meta["framework"] == "jax" and meta["weights_file"] == "generator.npz"
    with np.load(model_dir / "generator.npz") as arrays:  # torch's state dict names and layouts
        assert arrays["down.0.weight"].shape == (8, 4, 4, 4) and arrays["up.2.1.1.weight"].shape == (16, 32, 3, 3)
        assert "up.1.2.running_var" in arrays.files
        assert sum(arrays[k].size for k in arrays.files if "running" not in k) == g
    # map-reduce over two workers, against the whole frame on one (the rollout's reference): both runners in one rollout
    proc = run_in_process("infer", "--model-run", out["run_id"], "--steps", "4", "--mode", "mapreduce", "--workers", "2", "--tile", "32",
                          "--halo", "8", "--json", cwd=trainable)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rolled = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rolled["steps"] == 4 and rolled["frames_per_s"] > 0 and len(rolled["errors"]["vorticity"]) == 4
    assert client().get_run(rolled["run_id"]).data.tags[Tag.FRAMEWORK] == "jax"
    # the depth-3 U-Net sees little beyond the 8-pixel halo: the blended tiles give the whole frame's prediction (measured 1e-5)
    assert rolled["tiles"] == 3 and 0 <= rolled["seam_rel_error"] < 1e-3, rolled["seam_rel_error"]
    # the report: the training run among the runs, with its framework, and the rollout among the rollouts
    report = run_in_process("aggregate", "--runs", "all", "--name", "karman-jax", "--json", cwd=trainable)
    assert report.returncode == 0, report.stderr[-3000:]
    lines = Path(json.loads(report.stdout.strip().splitlines()[-1])["report"]).read_text().splitlines()
    trained_rows = [line for line in lines if f"`{out['run_id'][:8]}`" in line and "| karman |" in line]
    assert trained_rows and all("jax" in line for line in trained_rows) and any("FINISHED" in line for line in trained_rows)
    assert any(f"`{rolled['run_id'][:8]}`" in line and "| jax |" in line for line in lines)
