"""Performance profiles over workloads, as AlgoPerf scores submissions: ratios to the best, rho(tau), the area score, never-reached cells."""

import math

import pytest

from tasks.report.profiles import TAU_MAX, profiles, rho, section


def row(workload, framework, t, batch=8, status="FINISHED", learned_nothing="", device="cpu x1", cost=None):
    return {"workload": workload, "framework": framework, "device": device, "batch_size": batch, "setting": "s", "status": status,
            "learned_nothing": learned_nothing, "time_to_target_s": t, "cost_to_target": t / 100 if cost is None else cost}


def test_ratios_to_the_best_submission_give_its_profile_and_area_score():
    rows = [row("digits", "torch", 2.0), row("digits", "torch", 4.0), row("digits", "torch", 6.0),  # median 4
            row("digits", "jax", 8.0),
            row("har", "torch", 30.0), row("har", "jax", 10.0), row("har", "jax", 5.0, batch=64)]  # jax's best cell: 5
    prof = profiles(rows)
    assert prof["workloads"] == ["digits", "har"]
    assert prof["ratios"]["torch cpu x1"] == {"digits": 1.0, "har": 6.0}
    assert prof["ratios"]["jax cpu x1"] == {"digits": 2.0, "har": 1.0}
    # the area from 1 to TAU_MAX over (TAU_MAX - 1): each workload within TAU_MAX adds (TAU_MAX - r) / (TAU_MAX - 1) / workloads
    assert prof["scores"]["torch cpu x1"] == pytest.approx((TAU_MAX - 1) / (TAU_MAX - 1) / 2)
    assert prof["scores"]["jax cpu x1"] == pytest.approx(((TAU_MAX - 2) + (TAU_MAX - 1)) / (TAU_MAX - 1) / 2)
    assert rho(prof["ratios"]["jax cpu x1"], 1.5) == 0.5 and rho(prof["ratios"]["jax cpu x1"], 2.0) == 1.0


def test_a_missing_failed_useless_or_never_reached_cell_counts_as_never():
    nan = float("nan")
    rows = [row("digits", "torch", 2.0), row("digits", "jax", 1.0, learned_nothing="at chance"),
            row("karman", "torch", 50.0),  # jax has no karman
            row("har", "torch", nan), row("har", "jax", 3.0, status="FAILED"),  # nobody reached har: not scored
            row("calo", "tensorflow", nan)]
    prof = profiles(rows)
    assert prof["workloads"] == ["digits", "karman"]
    assert prof["ratios"]["jax cpu x1"] == {"digits": math.inf, "karman": math.inf} and prof["scores"]["jax cpu x1"] == 0.0
    assert prof["scores"]["torch cpu x1"] == 1.0 and prof["scores"]["tensorflow cpu x1"] == 0.0


def test_the_report_section_scores_by_time_and_by_cost_with_a_figure_each(tmp_path):
    rows = [row("digits", "torch", 2.0, cost=1.0), row("digits", "jax", 4.0, cost=0.5), row("har", "torch", 10.0, cost=1.0), row("har", "jax", 5.0, cost=1.0)]
    blocks, figures = section(rows, tmp_path)
    text = "\n".join(blocks)
    assert "**By time to target** over digits, har" in text and "**By cost to target** over digits, har" in text
    one = "(1 run: no interval)"  # each ratio says how many runs its median holds
    assert f"| torch cpu x1 | 0.833 | 1.00 {one} | 2.00 {one} |" in text  # by time: ((4-1) + (4-2)) / 3 / 2
    assert f"| jax cpu x1 | 1.000 | 1.00 {one} | 1.00 {one} |" in text  # by cost: the cheapest on both
    assert [f.name for f in figures] == ["performance_profile_time.png", "performance_profile_cost.png"] and all(f.stat().st_size > 0 for f in figures)
    assert section([row("digits", "torch", 2.0)], tmp_path) == ([], [])  # one submission: nothing to compare


def test_a_cell_is_a_complete_result_only_by_its_workloads_run_rules():
    from tasks.report.ranking import ranking, rules_of
    from tasks.workloads import RunRules

    rules = rules_of("digits")
    assert (rules.runs, rules.failures) == (5, 1) and rules_of("no-such-workload") == RunRules()

    def runs(framework, times):
        return [{**row("digits", framework, t), "shared_setting": "s", "size": "", "seed": i, "test_accuracy": 0.97, "test_f1": float("nan"),
                 "test_longitudinal_err": float("nan"), "test_sampling_fraction_err": float("nan"), "time_per_epoch_s": 1.0,
                 "samples_per_s": 1.0, "achieved_tflops": 1.0, "mfu_ceiling": 0.1, "mfu_peak": 0.1, "energy_j": float("nan"), "cost": float("nan"),
                 "energy_unavailable": "", "currency": "USD"}
                for i, t in enumerate(times)]

    nan = float("nan")
    table = {c["framework"]: c for c in ranking(runs("torch", [3.0, 4.0, 5.0, 6.0, nan]) + runs("jax", [3.0, 4.0, 5.0])
                                                + runs("tensorflow", [3.0, nan, nan, 4.0, 5.0]) + runs("slow", [3.0, 4.0, 5.0, 6.0, rules.max_runtime_s + 1]))["digits"]}
    assert table["torch"]["result"] == "complete"  # five runs, one missed
    assert table["jax"]["result"] == "indicative: 3 of 5 runs"
    assert table["tensorflow"]["result"] == "indicative: 2 missed the target (1 may)"
    assert table["slow"]["reached"] == 4 and table["slow"]["result"] == "complete"  # past max_runtime counts as missed


def test_energy_is_profiled_per_scope_never_across_scopes(tmp_path):
    def measured(workload, framework, device, joules, scope):
        return {**row(workload, framework, 10.0, device=device), "energy_to_target_j": joules, "energy_scope": scope}

    rows = [measured("digits", "torch", "cuda x1", 500.0, "GPU board"), measured("digits", "jax", "cuda x1", 1000.0, "GPU board"),
            measured("digits", "torch", "cpu x1", 90.0, "CPU package"), measured("digits", "jax", "cpu x1", 45.0, "CPU package"),
            {**row("digits", "tensorflow", 10.0), "energy_to_target_j": float("nan"), "energy_scope": "not measured"}]
    blocks, figures = section(rows, tmp_path)
    text = "\n".join(blocks)
    gpu = text.split("**By energy to target (GPU board)**", 1)[1].split("**By", 1)[0]
    cpu = text.split("**By energy to target (CPU package)**", 1)[1].split("**By", 1)[0]
    # each scope's submissions only: the CPU package's 45 J is never set against the GPU board's 500 J
    assert "| torch cuda x1 | 1.000 | 1.00 (1 run: no interval) |" in gpu and "| jax cuda x1 | 0.667 | 2.00 (1 run: no interval) |" in gpu
    assert "cpu" not in gpu
    assert "| jax cpu x1 | 1.000 | 1.00 (1 run: no interval) |" in cpu and "| torch cpu x1 | 0.667 | 2.00 (1 run: no interval) |" in cpu
    assert "cuda" not in cpu and "tensorflow" not in cpu
    assert {f.name for f in figures} >= {"performance_profile_energy_gpu_board.png", "performance_profile_energy_cpu_package.png"}
