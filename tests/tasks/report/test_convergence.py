"""Reference convergence points: the bound MLPerf's RCP checker computes, olympic means, interpolation and pruning between batch sizes, and the verdict on a cell's runs."""

import math

import pytest

from tasks.report.convergence import (Point, ReferenceRuns, References, at_cadence, half_width, interpolate, judge, load_references, olympic,
                                      point, pruned, reference_for)

TARGET = "validation accuracy at least 0.95"


def refs(points: dict[tuple[str, int], list[int]]) -> References:
    return References(workload="digits", target=TARGET, epoch_limit=12, device="cpu", made_by=["python -m flows rcp --workload digits"],
                      made_at="-", host="-", references=[runs(f, b, e) for (f, b), e in points.items()])


def runs(framework: str, batch: int, epochs: list[int], command: str = "python -m flows rcp --workload digits") -> ReferenceRuns:
    return ReferenceRuns(framework=framework, batch_size=batch, framework_version="-", epochs_to_target=epochs, seeds=list(range(len(epochs))),
                         made_by=command, benchmark_run="-", code_version="-")


def row(epochs_to_target: int | None, epochs: int = 8, every: int = 1, target: str = TARGET) -> dict:
    return {"epochs_to_target": epochs_to_target, "epochs": epochs, "validate_every": every, "target": target}


def test_the_accepted_minimum_is_the_one_mlperfs_rcp_checker_finds():
    """mlperf-logging's checker finds the smallest accepted mean by bisection on scipy's t-test; ours is its closed form."""
    from mlperf_logging.rcp_checker.rcp_checker import RCP_Checker

    checker = RCP_Checker.__new__(RCP_Checker)  # its statistics only: no rules file
    checker.alpha, checker.tolerance = 0.05, 1e-7
    for mean, sd, n_ref, runs in ((3.0, 0.5, 6, 5), (12.5, 1.7, 18, 10), (40.0, 4.0, 8, 3)):
        checker.submission_runs = runs
        theirs = checker._find_min_acceptable_mean(mean, sd, n_ref)
        ours = mean - half_width(Point(batch_size=1, mean=mean, sd=sd, n=n_ref, basis=""), runs - 2)
        assert ours == pytest.approx(theirs, abs=1e-5)


def test_olympic_means_drop_the_fastest_and_slowest_from_three_runs_on():
    assert olympic([5, 1, 3, 9]) == [3, 5] and olympic([4, 2]) == [2, 4]
    p = point(runs("torch", 64, [3, 3, 2, 4, 3, 3]), 1)
    assert (p.mean, p.n) == (3.0, 4) and p.sd == pytest.approx(math.sqrt(1 / 3))  # the deviation of every run, as MLPerf's
    # all alike: at least the measure's own resolution (a validation every k epochs), so that a neighbour is not rejected outright
    alike = point(runs("torch", 64, [3] * 5), 2)
    assert (alike.mean, alike.sd) == (4.0, pytest.approx(2 / math.sqrt(12)))  # at cadence 2, epoch 3 shows at the validation of epoch 4
    assert [at_cadence(e, 2) for e in (1, 2, 3)] == [2, 2, 4]


def test_batch_sizes_between_references_are_interpolated_over_the_pruned_points():
    p = {b: Point(batch_size=b, mean=m, sd=0.5, n=4, basis="") for b, m in ((16, 4.0), (32, 2.0), (64, 3.5), (128, 4.0), (256, 8.0))}
    kept = [q.batch_size for q in pruned(list(p.values()))]
    assert kept == [32, 128, 256]  # 16: below the fastest (32); 64: slower than the line from 32 to 128 (2.67)
    mid = interpolate(96, p[64], p[128])
    assert (mid.mean, mid.sd, mid.basis) == (3.75, 0.5, "interpolated between batch 64 and 128")
    r = refs({("torch", 32): [2, 2, 3, 2, 2], ("torch", 128): [4, 4, 5, 4, 4]})
    ref, slow_side, _ = reference_for(r, "torch", 64, 1)
    assert ref.mean == pytest.approx(2 + (4 - 2) * (64 - 32) / (128 - 32)) and slow_side
    ref, slow_side, _ = reference_for(r, "torch", 16, 1)
    assert ref.batch_size == 32 and not slow_side  # below every reference: only the fast side is judged (MLPerf)
    assert reference_for(r, "torch", 256, 1)[0] is None and "above the referenced batch sizes (32, 128)" in reference_for(r, "torch", 256, 1)[2]
    assert reference_for(r, "jax", 32, 1)[2] == "no reference points for jax"


def test_a_cell_is_within_fast_or_slow_and_a_missed_run_counts_as_never():
    r = refs({("torch", 64): [3, 3, 2, 4, 3, 3]})
    assert judge([row(3), row(3), row(4)], r, "torch", 64)["verdict"] == "within"
    fast = judge([row(1), row(1), row(1)], r, "torch", 64)
    assert fast["verdict"] == "fast" and fast["epochs_mean"] == 1 and fast["low"] > 1
    slow = judge([row(6), row(7), row(6)], r, "torch", 64)
    assert slow["verdict"] == "slow" and slow["high"] < 6
    # one run that never reached the target is dropped as the slowest; two are a failure to converge
    assert judge([row(3), row(3), row(3), row(None)], r, "torch", 64)["verdict"] == "within"
    never = judge([row(3), row(None), row(None)], r, "torch", 64)
    assert never["verdict"] == "slow" and never["why"].startswith("2 of 3 runs never reached the target")
    # a run that stopped before any accepted mean cannot be judged slow for missing
    short = judge([row(None, epochs=3)], r, "torch", 64)
    assert short["verdict"] == "not judged" and short["why"].startswith("too short to judge: its runs ended by epoch 3 without reaching the target")
    assert judge([row(3, target="validation accuracy at least 0.9")], r, "torch", 64)["verdict"] == "not judged"
    assert judge([row(4, every=2)], r, "torch", 64)["verdict"] == "within"  # epoch 3 of the references shows at 4 every 2 epochs


def test_the_committed_references_of_digits_read():
    digits = load_references("digits")
    assert digits is not None and digits.workload == "digits" and all(c.startswith("python -m flows rcp --workload digits") for c in digits.made_by)
    assert {r.framework for r in digits.references} == {"torch", "tensorflow", "jax"}
    assert all(len(r.epochs_to_target) + len(r.missed) >= 5 for r in digits.references)
    assert load_references("no-such-workload") is None


def test_a_cells_trend_shows_its_versions_and_flags_a_step_with_the_versions_on_both_sides():
    from tasks.report.history import sparkline, trend_rows

    assert sparkline([1.0, 2.0, 8.0]) == "▁▂█" and sparkline([3.0, 3.0]) == "▁▁"
    cells = [{"cell": "digits | cpu x1 | batch 32", "versions": [{"version": "git:a torch 2.9", "runs": 2, "median": 1.0},
                                                 {"version": "src:b torch 2.9", "runs": 1, "median": 3.2}],
              "flags": [{"from": "git:a torch 2.9", "to": "src:b torch 2.9", "change": 2.2, "noise": 0.1}]},
             {"cell": "digits b128", "versions": [{"version": "git:a torch 2.9", "runs": 1, "median": 1.0},
                                                  {"version": "src:b torch 2.9", "runs": 1, "median": 1.02}], "flags": []},
             {"cell": "digits b64", "versions": [{"version": "git:a torch 2.9", "runs": 3, "median": 1.0}], "flags": []}]
    rows = {r["cell"]: r for r in trend_rows(cells)}
    assert set(rows) == {"digits · cpu x1 · batch 32", "digits b128"}  # one version: no trend; no pipe inside a table's cell
    rows["digits b32"] = rows.pop("digits · cpu x1 · batch 32")
    assert rows["digits b32"]["trend"] == "▁█" and rows["digits b32"]["flagged"]
    assert rows["digits b32"]["change"] == "**+220%** (git:a torch 2.9 → src:b torch 2.9, beyond 10%)"
    assert rows["digits b32"]["versions"] == "git:a torch 2.9 (2) → src:b torch 2.9 (1)"
    assert rows["digits b128"]["change"] == "within the noise" and not rows["digits b128"]["flagged"]


def test_rcp_refuses_bad_input_in_one_line_before_anything_trains(workdir):
    from tests.conftest import run_in_process
    from tests.flows.test_cli import assert_refused

    assert_refused(run_in_process("rcp", "--workload", "nope", cwd=workdir), "unknown workload 'nope'", "digits")
    assert_refused(run_in_process("rcp", "--workload", "digits", "--seeds", "3", cwd=workdir), "--seeds", "(got '3')")
    toy = {"KARMAN_WORKLOADS": "toy=tests.workloads.toy"}  # every built-in workload has all three frameworks: the toy one lacks jax
    assert_refused(run_in_process("rcp", "--workload", "toy", "--frameworks", "jax", cwd=workdir, env=toy), "workload toy has no jax version")
    assert_refused(run_in_process("rcp", "--workload", "digits", "--out", str(workdir / "nowhere"), cwd=workdir), "is not a folder")
    assert not (workdir / "data").exists()  # nothing trained, nothing written, not even the data root the refusals made


def test_below_every_referenced_batch_size_only_converging_too_fast_is_flagged():
    r = refs({("torch", 64): [3, 3, 2, 4, 3, 3], ("torch", 128): [4, 4, 5, 4, 4, 4]})
    assert judge([row(1), row(1), row(1)], r, "torch", 32)["verdict"] == "fast"
    slower = judge([row(None, epochs=12), row(None, epochs=12)], r, "torch", 32)
    assert slower["verdict"] == "within" and slower["why"].endswith("(slower is not judged here)")


def test_a_later_command_adds_its_points_beside_the_earlier_ones_each_naming_its_command():
    from tasks.report.convergence import merged

    first = refs({("torch", 64): [3, 3, 3, 3, 3], ("torch", 128): [4, 4, 4, 4, 4]})
    later = refs({("torch", 128): [5, 5, 5, 5, 5], ("jax", 64): [3, 3, 3, 3, 3]})
    later = later.model_copy(update={"references": [r.model_copy(update={"made_by": "python -m flows rcp --workload digits --seeds 5"})
                                                    for r in later.references], "made_by": ["python -m flows rcp --workload digits --seeds 5"]})
    both = merged(first, later)
    assert [(r.framework, r.batch_size, r.epochs_to_target[0]) for r in both.references] == [("jax", 64, 3), ("torch", 64, 3), ("torch", 128, 5)]
    assert both.made_by == ["python -m flows rcp --workload digits --seeds 5", "python -m flows rcp --workload digits"]
    other = later.model_copy(update={"target": "validation accuracy at least 0.9"})
    assert merged(first, other) == other  # another target: the earlier points do not hold for it
