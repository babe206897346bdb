"""A cell's median with its 95 % bootstrap interval and n, and the ties the ranking and the profiles call where intervals overlap."""

import math

import numpy as np
import pytest
from scipy.stats import bootstrap

from tasks.common.reports.reporting import table_markdown
from tasks.report.intervals import RESAMPLES, SEED, Interval
from tasks.report.profiles import profiles, section
from tasks.report.ranking import cell_summaries, ranking, ranking_columns, ties_line

nan = float("nan")


def test_five_runs_give_their_smallest_and_largest_as_the_interval_of_their_median():
    # a resample's median is the smallest value when 3 or more of its 5 draws are: binomial(5, 1/5) >= 3 has p = 0.058 > 0.025,
    # so the 2.5th percentile of the bootstrap medians is the smallest value itself (and the 97.5th the largest)
    assert Interval.of([33.6, 1.73, 64.3, 20.0, 50.0]) == Interval(33.6, 1.73, 64.3, 5)
    assert Interval.of([33.6, 1.73, 64.3, 20.0, 50.0]).text("s") == "33.6 s [1.73–64.3], n=5"


def test_the_interval_is_scipys_percentile_bootstrap_of_the_median_at_the_fixed_seed():
    sample = [3.1, 2.7, 4.0, 3.3, 2.9, 3.8, 3.0, 5.2]
    expected = bootstrap((np.array(sample),), np.median, confidence_level=0.95, n_resamples=RESAMPLES, method="percentile",
                         rng=np.random.default_rng(SEED)).confidence_interval
    got = Interval.of(sample)
    assert (got.median, got.low, got.high, got.n) == (3.2, expected.low, expected.high, 8)
    assert Interval.of(sample) == got  # the same runs, the same interval: reports are reproducible


def test_one_run_has_no_interval_and_identical_runs_a_point():
    one = Interval.of([12.5, nan])  # NaN is no run
    assert one.n == 1 and one.median == 12.5 and math.isnan(one.low) and math.isnan(one.high)
    assert one.text("s") == "12.5 s (1 run: no interval)"
    assert one.as_dict() == {"median": 12.5, "low": None, "high": None, "n": 1}
    assert Interval.of([4.0] * 5) == Interval(4.0, 4.0, 4.0, 5)
    assert Interval.of([]).text() == "–" and Interval.of([]).n == 0


def test_a_run_that_missed_counts_as_the_slowest():
    # as MLPerf counts a missed run: the median of 10, 11, 12, 13 and a miss is 12, and the interval reaches 'not reached'
    missed = Interval.of([10.0, 11.0, 12.0, 13.0, math.inf])
    assert (missed.median, missed.low, missed.high, missed.n) == (12.0, 10.0, math.inf, 5)
    assert missed.text("s") == "12 s [10–not reached], n=5" and missed.as_dict()["high"] == "not reached"
    assert Interval.of([10.0, math.inf, math.inf]).median == math.inf and Interval.of([math.inf] * 3).text() == "not reached, n=3"


def test_intervals_overlap_where_they_share_a_value_and_never_without_an_interval():
    a, b, c = Interval(12, 10, 14, 5), Interval(14, 12, 16, 5), Interval(32, 30, 34, 5)
    assert a.overlaps(b) and b.overlaps(a) and not a.overlaps(c)
    assert Interval(14, 14, 18, 5).overlaps(a)  # touching bounds share a value
    assert not Interval.of([12.0]).overlaps(a) and not a.overlaps(Interval.of([12.0]))  # one run: no interval, no tie
    assert Interval(50, 10, 90, 5).scaled(0.01) == Interval(0.5, 0.1, 0.9, 5)


def run(framework, t, seed, device="cpu x1", accuracy=0.97, samples=100.0):
    return {"workload": "digits", "framework": framework, "device": device, "batch_size": 64, "setting": "s", "shared_setting": "s",
            "status": "FINISHED", "learned_nothing": "", "size": "", "seed": seed, "time_to_target_s": t, "cost_to_target": t / 100,
            "test_accuracy": accuracy, "test_f1": nan, "test_longitudinal_err": nan, "test_sampling_fraction_err": nan,
            "time_per_epoch_s": 1.0, "samples_per_s": samples + seed, "achieved_tflops": 1.0, "mfu_ceiling": 10.0 + seed, "mfu_peak": 1.0,
            "energy_j": nan, "energy_scope": "", "energy_samples": None, "cost": nan, "energy_unavailable": "", "currency": "USD"}


def cell(framework, times, device="cpu x1"):
    return [run(framework, t, i, device) for i, t in enumerate(times)]


# torch and jax overlap (10-14 s against 12-16 s); tensorflow (30-34 s) is apart; mxnet's one run has no interval
RECORDED = (cell("torch", [10.0, 11.0, 12.0, 13.0, 14.0]) + cell("jax", [12.0, 13.0, 14.0, 15.0, 16.0])
            + cell("tensorflow", [30.0, 31.0, 32.0, 33.0, 34.0]) + cell("mxnet", [33.0]))


def test_the_ranking_calls_overlapping_cells_a_tie_and_separate_ones_not():
    table = ranking(RECORDED)["digits"]
    assert [(c["framework"], c["rank"], c["tie"]) for c in table] == [
        ("torch", 1, ""), ("jax", 1, "torch cpu x1 b64"), ("tensorflow", 3, ""), ("mxnet", 4, "")]
    assert ties_line(table) == "torch cpu x1 b64 and jax cpu x1 b64 tie on time to target (intervals overlap).\n"
    text = table_markdown(table, ranking_columns(table))
    # the table shows each figure's median, interval and n
    assert "| 1 | torch | cpu x1 | 64 | 5 | 5 | complete | 12 [10–14], n=5 | 97 [97–97], n=5 | 1 | 102 [100–104], n=5 |" in text
    assert "| 33 (1 run: no interval) |" in text and "| 10 (1 run: no interval) |" in text
    (torch,) = [c for c in cell_summaries(RECORDED, {"digits": table}) if c["framework"] == "torch"]
    assert torch["time_to_target_s"] == {"median": 12.0, "low": 10.0, "high": 14.0, "n": 5} and torch["rank"] == 1
    # in the units of the runs' MLflow metrics: accuracy and the share of the ceiling as fractions
    assert torch["test_accuracy"] == {"median": 0.97, "low": 0.97, "high": 0.97, "n": 5}
    assert torch["mfu_ceiling"] == pytest.approx({"median": 0.12, "low": 0.10, "high": 0.14, "n": 5})


def test_a_missed_run_counts_as_the_slowest_in_the_ranking():
    table = ranking(cell("torch", [10.0, 11.0, 12.0, 13.0, nan]) + cell("jax", [10.0, nan, nan, 11.0, nan]))["digits"]
    torch, jax = table
    assert (torch["time_to_target_s"], torch["reached"], torch["time_to_target_s_ci"]) == (12.0, 4, "12 [10–not reached], n=5")
    assert jax["rank"] == "–" and math.isnan(jax["time_to_target_s"])  # three of five missed: its median run never reached it


def test_the_profiles_use_the_medians_say_n_and_call_overlapping_submissions_a_tie(tmp_path):
    prof = profiles(RECORDED)
    assert prof["ratios"]["jax cpu x1"]["digits"] == pytest.approx(14.0 / 12.0)
    assert prof["ties"] == {"digits": ["torch cpu x1", "jax cpu x1"]}  # not tensorflow's, whose interval is apart
    assert {s: v["digits"].n for s, v in prof["intervals"].items()} == {"jax cpu x1": 5, "mxnet cpu x1": 1, "tensorflow cpu x1": 5,
                                                                        "torch cpu x1": 5}
    text = "\n".join(section(RECORDED, tmp_path)[0])  # mxnet: (4 - 33 / 12) / 3
    assert "| torch cpu x1 | 1.000 | 1.00 (n=5) |" in text and "| mxnet cpu x1 | 0.417 | 2.75 (1 run: no interval) |" in text
    assert "On digits, torch cpu x1 and jax cpu x1 tie (intervals overlap)." in text
    apart = profiles(cell("torch", [10.0, 11.0, 12.0, 13.0, 14.0]) + cell("tensorflow", [30.0, 31.0, 32.0, 33.0, 34.0]))
    assert apart["ties"] == {"digits": []}
