"""The ablation's rows: the worst of the long rollouts per score, and medians over seeds."""

import json
import math
from pathlib import Path

from tasks.workloads.karman.report import ablation_medians, ablation_row


def rollout(**scores) -> dict:
    return {"horizon_u": 60, "horizon_vorticity": 50, "one_step_rel_l2_vorticity": 0.05} | scores


def test_the_long_columns_are_the_worst_of_the_long_rollouts_each_in_its_own_sense():
    long = [
        rollout(horizon_vorticity=120, correlation_periods=20.0, energy_ratio_max_deviation=0.03, shedding_amplitude_ratio=1.15,
                frequency_rel_error_phase=-0.004, horizon_u=300, horizon_vorticity_lagged=500),
        rollout(horizon_vorticity=90, correlation_periods=25.0, energy_ratio_max_deviation=0.08, shedding_amplitude_ratio=0.9,
                frequency_rel_error_phase=0.002, horizon_u=250, horizon_vorticity_lagged=600),
    ]
    row = ablation_row("damped-change", 3, {"run_id": "abcdef0123", "epochs": 7, "train_time_s": 30.0}, rollout(), long)
    assert (row["variant"], row["seed"], row["train_run"], row["epochs"]) == ("damped-change", 3, "abcdef01", 7)
    assert (row["long_horizon_vorticity"], row["long_horizon_u"], row["long_horizon_vorticity_lagged"]) == (90, 250, 500)
    assert row["long_correlation_periods"] == 20.0
    assert row["long_energy_ratio_max_deviation"] == 0.08
    assert row["long_shedding_amplitude_ratio"] == 1.15  # 0.15 from 1 is worse than 0.1
    assert row["long_frequency_rel_error_phase"] == -0.004  # the largest in size, its sign kept
    assert math.isnan(row["time_to_target_s"]) and row["horizon_vorticity"] == 50


def test_a_score_missing_from_one_long_rollout_is_not_replaced_by_the_others():
    long = [rollout(correlation_periods=20.0), rollout(correlation_periods=float("nan"))]
    row = ablation_row("default", 0, {"run_id": "0" * 32, "epochs": 1}, rollout(), long)
    assert math.isnan(row["long_correlation_periods"])
    assert all(math.isnan(v) for k, v in ablation_row("default", 0, {"run_id": "0" * 32, "epochs": 1}, rollout(), []).items()
               if k.startswith("long_"))


def test_medians_are_per_variant_over_the_runs_that_finished():
    rows = [ablation_row("default", s, {"run_id": f"{s}" * 8, "epochs": e}, rollout(horizon_vorticity=h), [])
            for s, e, h in ((0, 10, 40), (1, 12, 60), (2, 11, 55))]
    rows.append(ablation_row("stride-2", 0, {"run_id": "FAILED", "epochs": 0}, {}, []))
    rows.append(ablation_row("stride-2", 1, {"run_id": "9" * 8, "epochs": 5}, rollout(horizon_vorticity=30), []))
    medians = {m["variant"]: m for m in ablation_medians(rows)}
    assert list(medians) == ["default", "stride-2"]
    assert (medians["default"]["runs"], medians["default"]["epochs"], medians["default"]["horizon_vorticity"]) == (3, 11, 55)
    assert (medians["stride-2"]["runs"], medians["stride-2"]["epochs"], medians["stride-2"]["horizon_vorticity"]) == (1, 5, 30)
    assert math.isnan(medians["default"]["long_horizon_u"])


def test_the_written_ablation_has_the_long_columns_only_with_long_rollouts_and_medians_only_over_seeds(workdir):
    from tasks.common.config.settings import Settings
    from tasks.report.ablation import write_ablation
    from tasks.workloads import get_workload

    settings = Settings.from_env()
    params = {"time_budget": 300.0, "dataset": "demo", "ngf": 16, "batch_size": 8, "steps": 60, "extra_dataset": "long", "extra_steps": 600}
    results = [("default", s, {"run_id": f"{s}" * 32, "epochs": 10 + s}, rollout(), [rollout(correlation_periods=9.0 + s)]) for s in (0, 1, 2)]
    rows, markdown = get_workload("karman").ablation("two", params, results, "sim-110", ["sim-105"])  # the ablate flow's table
    assert json.dumps(rows) == json.dumps([ablation_row(*result) for result in results])  # (NaN where a score is missing)
    written = write_ablation.fn(settings, "two", params, rows, markdown)
    text = open(written["report"]).read()
    assert Path(written["report"]).with_name("ablation.json").read_text() == json.dumps(rows, indent=2)
    assert "seeds 0, 1, 2" in text and "600 steps on every simulation of dataset `long` (sim-105)" in text
    medians = text.split("## Medians over the seeds")[1]
    assert "long_correlation_periods" in medians and "| default | 3 | 11 |" in medians  # runs, median epochs
    one = get_workload("karman").ablation("one", params | {"extra_dataset": None}, [("default", 0, {"run_id": "0" * 32, "epochs": 3}, rollout(), [])], "sim-110")
    single = open(write_ablation.fn(settings, "one", params | {"extra_dataset": None}, *one)["report"]).read()
    assert "long_" not in single and "Medians" not in single and "seeds 0," not in single
