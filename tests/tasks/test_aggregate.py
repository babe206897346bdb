"""The report's time-to-quality table over real MLflow runs (a local store)."""

import math

from mlflow.tracking import MlflowClient

from tasks.aggregate import quality_table


def _run(client, exp, batch: int, seed: int, reached: bool, time_to_target: float, status: str = "FINISHED"):
    run = client.create_run(exp, tags={"karman.stage": "train"})
    rid = run.info.run_id
    for k, v in {"framework": "torch", "device": "cpu", "world_size": 1, "batch_size": batch, "seed": seed,
                 "recipe_label": "default", "target_vorticity": 0.3, "target_steps": 40}.items():
        client.log_param(rid, k, v)
    client.log_metric(rid, "train_time_s", 300.0)
    client.log_metric(rid, "time_per_epoch_s", 5.0 + seed)
    client.log_metric(rid, "target_reached", float(reached))
    if reached:
        client.log_metric(rid, "time_to_target_s", time_to_target)
    client.set_terminated(rid, status)
    return rid


def test_time_to_quality_drops_the_fastest_and_slowest_and_lists_runs_that_missed(workdir):
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'q.db'}")
    exp = client.create_experiment("q", artifact_location=str(workdir / "art"))
    for seed, t in enumerate([100.0, 40.0, 70.0, 160.0]):
        _run(client, exp, 8, seed, True, t)
    missed = _run(client, exp, 8, 4, False, 0.0)
    _run(client, exp, 8, 5, True, 1.0, status="FAILED")  # a failed run is no evidence either way
    _run(client, exp, 16, 0, True, 50.0)
    _run(client, exp, 16, 1, True, 30.0)
    rows = quality_table(client.search_runs([exp], "tags.`karman.stage` = 'train'"))
    b8, b16 = rows
    assert (b8["batch_size"], b8["runs"], b8["reached"]) == (8, 5, 4)
    assert b8["time_to_target_s"] == (70.0 + 100.0) / 2  # 40 and 160 dropped
    assert (b8["fastest_s"], b8["slowest_s"]) == (40.0, 160.0)
    assert b8["not_reached"] == missed[:8]
    assert b8["target"] == "vorticity <= 0.3 for 40 steps" and b8["device"] == "cpu x1"
    assert (b16["runs"], b16["reached"], b16["time_to_target_s"], b16["not_reached"]) == (2, 2, 40.0, "-")  # two: no drop


def test_a_configuration_that_never_reached_the_target_has_no_time(workdir):
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'q.db'}")
    exp = client.create_experiment("q", artifact_location=str(workdir / "art"))
    _run(client, exp, 8, 0, False, 0.0)
    (row,) = quality_table(client.search_runs([exp], "tags.`karman.stage` = 'train'"))
    assert row["reached"] == 0 and math.isnan(row["time_to_target_s"]) and row["not_reached"] != "-"
