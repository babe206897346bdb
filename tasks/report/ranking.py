"""The report's ranking: per workload judged by its own runs' quality, frameworks and devices ranked by time to its target."""

import statistics

from tasks.report.capabilities import workload_of
from tasks.report.energy import cell_energy
from tasks.workloads import RunRules

RANKING_COLUMNS = {"rank": "rank", "framework": "framework", "size": "network (layers x units)", "device": "device", "batch_size": "batch",
                   "runs": "runs", "reached": "reached", "result": "result (run rules)", "convergence": "convergence (RCP)", "time_to_target_s": "to target [s]", "target_spread": "to target over seeds",
                   "test_accuracy": "test accuracy [%]", "accuracy_spread": "accuracy over seeds", "test_f1": "test macro-F1 [%]",
                   "test_longitudinal_err": "test longitudinal max error [%]", "test_sampling_fraction_err": "test sampling-fraction max error [%]",
                   "time_per_epoch_s": "s/epoch", "samples_per_s": "samples/s",
                   "achieved_tflops": "TFLOPS", "mfu_ceiling": "% of ceiling", "mfu_peak": "% of peak", "energy": "energy", "cost_text": "cost"}


def ranking_columns(table: list[dict]) -> dict[str, str]:
    """The ranking's columns for one workload's table: the network size only where one is swept, and of the
    test scores (accuracy, macro-F1, the shower metrics) those the workload reports."""
    def shown(key: str) -> bool:
        return any(r[key] not in ("", None) and r[key] == r[key] for r in table)

    # column -> the value whose presence shows it (accuracy's spread goes with accuracy)
    optional = {k: k for k in ("size", "test_accuracy", "test_f1", "test_longitudinal_err", "test_sampling_fraction_err")}
    optional["accuracy_spread"] = "test_accuracy"
    optional["convergence"] = "convergence"
    return {k: v for k, v in RANKING_COLUMNS.items() if k not in optional or shown(optional[k])}


def ranking(rows: list[dict], convergence: dict[tuple, str] | None = None) -> dict[str, list[dict]]:
    """Per workload the ranking takes (``ranked``), seed 004's table done right: per (framework, device, batch
    size), over its repeated runs, the median time to the quality target with its spread (min-max), the runs that
    reached it within the workload's max_runtime, whether they make a result by its run rules (``result``: complete, or
    indicative and why), the median test accuracy at the end and its spread, s/epoch, samples/s, TFLOPS and utilisation;
    ranked by median time to target (cells that never reached it last). ``convergence``: each cell's verdict against its workload's
    reference convergence points (tasks.report.convergence), by its key (workload, framework, device, batch size, setting)."""
    nan = float("nan")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "FINISHED" and ranked(r["workload"]) and not r.get("learned_nothing"):
            groups.setdefault((r["workload"], r["framework"], r["device"], r["batch_size"], r["shared_setting"]), []).append(r)

    def median(members, key):
        values = [m[key] for m in members if m[key] == m[key]]
        return statistics.median(values) if values else nan

    def spread(members, key, scale=1.0, digits=3):
        values = sorted(m[key] * scale for m in members if m[key] == m[key])
        return f"{values[0]:.{digits}g}–{values[-1]:.{digits}g}" if len(values) > 1 else "–"

    out: dict[str, list[dict]] = {}
    for (workload, framework, device, batch, shared), members in groups.items():
        rules = rules_of(workload)
        reached = [m for m in members if rules.reached(m["time_to_target_s"])]  # (within the workload's max_runtime)
        out.setdefault(workload, []).append({
            "framework": framework, "size": members[0]["size"], "device": device, "batch_size": batch, "runs": len(members), "reached": len(reached),
            "result": rules.verdict(len(members), len(reached)), "convergence": (convergence or {}).get((workload, framework, device, batch, shared), ""),
            "time_to_target_s": median(reached, "time_to_target_s") if reached else nan, "target_spread": spread(reached, "time_to_target_s"),
            "test_accuracy": 100 * median(members, "test_accuracy"), "accuracy_spread": spread(members, "test_accuracy", 100, 4),
            "test_f1": 100 * median(members, "test_f1"),
            "test_longitudinal_err": 100 * median(members, "test_longitudinal_err"),
            "test_sampling_fraction_err": 100 * median(members, "test_sampling_fraction_err"),
            "time_per_epoch_s": median(members, "time_per_epoch_s"), "samples_per_s": median(members, "samples_per_s"),
            "achieved_tflops": median(members, "achieved_tflops"), "mfu_ceiling": median(members, "mfu_ceiling"),
            "mfu_peak": median(members, "mfu_peak"), **cell_energy(members)})
    for table in out.values():
        table.sort(key=lambda c: (c["time_to_target_s"] != c["time_to_target_s"], c["time_to_target_s"], c["framework"]))
        for rank, c in enumerate(table, 1):
            c["rank"] = rank if c["time_to_target_s"] == c["time_to_target_s"] else "–"
    return out


def rules_of(workload: str) -> RunRules:
    """The workload's run rules; the default ones for a workload this process does not know."""
    known = workload_of(workload)
    return known.rules if known else RunRules()


def unranked_line(rows: list[dict]) -> str:
    """The line naming the finished runs the ranking leaves out because they learned nothing, with why; '' where none."""
    out = [f"{r['run']} ({r['workload']} {r['framework']} {r['device']} b{r['batch_size']}: {r['learned_nothing']})"
           for r in rows if r["status"] == "FINISHED" and r.get("learned_nothing")]
    return f"Left out of the ranking, as they learned nothing: {'; '.join(out)}.\n" if out else ""


def resumed_line(rows: list[dict]) -> str:
    """The line naming the finished runs whose time to target the report leaves out because they were resumed; '' where none."""
    out = [f"{r['run']} ({r['workload']} {r['framework']} {r['device']} b{r['batch_size']}, resumed {r['resumes']}x)"
           for r in rows if r["status"] == "FINISHED" and r.get("resumes")]
    return (f"Time to target left out for resumed runs (their clock stopped while they were down, so it is no time-to-train, "
            f"as MLPerf rules): {'; '.join(out)}.\n") if out else ""


def ranked(workload: str) -> bool:
    """Whether the ranking takes ``workload``'s training runs: not where its quality is its rollouts' (those compare
    their frameworks in their own sections); a workload this process does not know is ranked."""
    known = workload_of(workload)
    return not (known and known.rollouts)
