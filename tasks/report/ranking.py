"""The report's ranking: per workload judged by its own runs' quality, frameworks and devices ranked by time to its target."""

import math
import statistics

from tasks.report.capabilities import workload_of
from tasks.report.energy import cell_energy
from tasks.report.intervals import Interval
from tasks.workloads import RunRules

RANKING_COLUMNS = {"rank": "rank", "framework": "framework", "size": "network (layers x units)", "device": "device", "batch_size": "batch",
                   "runs": "runs", "reached": "reached", "result": "result (run rules)", "convergence": "convergence (RCP)",
                   "time_to_target_s_ci": "to target [s]", "test_accuracy_ci": "test accuracy [%]", "test_f1_ci": "test macro-F1 [%]",
                   "test_longitudinal_err_ci": "test longitudinal max error [%]", "test_sampling_fraction_err_ci": "test sampling-fraction max error [%]",
                   "time_per_epoch_s": "s/epoch", "samples_per_s_ci": "samples/s",
                   "achieved_tflops": "TFLOPS", "mfu_ceiling_ci": "% of ceiling", "mfu_peak": "% of peak", "energy": "energy", "cost_text": "cost"}
# the figures each cell gives as a median with its interval (tasks.report.intervals), and the factor they are shown at
SPREAD = {"time_to_target_s": 1, "samples_per_s": 1, "test_accuracy": 100, "test_f1": 100, "test_longitudinal_err": 100,
          "test_sampling_fraction_err": 100, "mfu_ceiling": 1}


def ranking_columns(table: list[dict]) -> dict[str, str]:
    """The ranking's columns for one workload's table: the network size only where one is swept, and of the
    test scores (accuracy, macro-F1, the shower metrics) those the workload reports."""
    def shown(key: str) -> bool:
        return any(r[key] not in ("", None) and r[key] == r[key] for r in table)

    # column -> the value whose presence shows it
    optional = {k + "_ci": k for k in ("test_accuracy", "test_f1", "test_longitudinal_err", "test_sampling_fraction_err")}
    optional |= {"size": "size", "convergence": "convergence"}
    return {k: v for k, v in RANKING_COLUMNS.items() if k not in optional or shown(optional[k])}


def times_to_target(members: list[dict], rules: RunRules) -> list[float]:
    """Each run's time to the target, a run that missed it (or reached it past max_runtime) counted as slower than every
    run that reached it (+inf), as MLPerf counts a missed run as the slowest."""
    return [m["time_to_target_s"] if rules.reached(m["time_to_target_s"]) else math.inf for m in members]


def cell_intervals(members: list[dict], rules: RunRules, shown: bool = True) -> dict[str, Interval]:
    """A cell's figures over its runs, each a median with its 95 % interval and n: as the report shows them (SPREAD's factors),
    or (``shown`` False) in the units of the runs' MLflow metrics (test scores and the share of the ceiling as fractions)."""
    factors = SPREAD if shown else {key: 0.01 if key == "mfu_ceiling" else 1 for key in SPREAD}  # rows hold mfu_ceiling in percent
    out = {key: Interval.of([m[key] * factor for m in members]) for key, factor in factors.items() if key != "time_to_target_s"}
    return {"time_to_target_s": Interval.of(times_to_target(members, rules)), **out}


def ranking(rows: list[dict], convergence: dict[tuple, str] | None = None) -> dict[str, list[dict]]:
    """Per workload the ranking takes (``ranked``), seed 004's table done right: per (framework, device, batch
    size), over its repeated runs, the median time to the quality target with its 95 % interval (a run that missed the
    target, or reached it past the workload's max_runtime, counted as the slowest), the runs that reached it, whether they
    make a result by its run rules (``result``: complete, or indicative and why), the median test scores, samples/s and
    utilisation with their intervals, s/epoch and TFLOPS; ranked by median time to target (cells with no median time last).
    A cell whose interval overlaps the one ranked above it ties with it and shares its rank (``tie``). ``convergence``:
    each cell's verdict against its workload's reference convergence points (tasks.report.convergence), by its key
    (workload, framework, device, batch size, setting)."""
    nan = float("nan")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "FINISHED" and ranked(r["workload"]) and not r.get("learned_nothing"):
            groups.setdefault((r["workload"], r["framework"], r["device"], r["batch_size"], r["shared_setting"]), []).append(r)

    def median(members, key):
        values = [m[key] for m in members if m[key] == m[key]]
        return statistics.median(values) if values else nan

    out: dict[str, list[dict]] = {}
    for (workload, framework, device, batch, shared), members in groups.items():
        rules = rules_of(workload)
        spread = cell_intervals(members, rules)
        to_target = spread["time_to_target_s"].median
        out.setdefault(workload, []).append({
            "framework": framework, "size": members[0]["size"], "device": device, "batch_size": batch, "setting": shared,
            "runs": len(members), "reached": sum(rules.reached(m["time_to_target_s"]) for m in members),
            "convergence": (convergence or {}).get((workload, framework, device, batch, shared), ""),
            "time_to_target_s": to_target if math.isfinite(to_target) else nan,
            **{key: iv.median for key, iv in spread.items() if key != "time_to_target_s"},
            **{key + "_ci": iv.text() for key, iv in spread.items()},
            "intervals": spread, "time_per_epoch_s": median(members, "time_per_epoch_s"),
            "achieved_tflops": median(members, "achieved_tflops"), "mfu_peak": median(members, "mfu_peak"), **cell_energy(members)})
        out[workload][-1]["result"] = rules.verdict(len(members), out[workload][-1]["reached"])
    for table in out.values():
        table.sort(key=lambda c: (c["time_to_target_s"] != c["time_to_target_s"], c["time_to_target_s"], c["framework"]))
        for i, c in enumerate(table):
            above = table[i - 1] if i else None
            timed = c["time_to_target_s"] == c["time_to_target_s"]
            tied = timed and above is not None and above["rank"] != "–" and c["intervals"]["time_to_target_s"].overlaps(
                above["intervals"]["time_to_target_s"])
            c["rank"] = above["rank"] if tied else i + 1 if timed else "–"
            c["tie"] = cell_name(above) if tied else ""
    return out


def cell_name(cell: dict) -> str:
    """A ranked cell in a few words: framework, device, batch size (and the network's size where one is swept)."""
    return f"{cell['framework']} {cell['device']} b{cell['batch_size']}" + (f" ({cell['size']})" if cell.get("size") else "")


def ties_line(table: list[dict]) -> str:
    """The line under a workload's ranking naming the cells that tie on time to target, each group in words; '' where none do."""
    groups: list[list[str]] = []
    for c in table:
        if c["tie"]:
            groups[-1].append(cell_name(c))
        else:
            groups.append([cell_name(c)])
    words = [(", ".join(g[:-1]) + " and " + g[-1]) for g in groups if len(g) > 1]
    return "".join(f"{w} tie on time to target (intervals overlap).\n" for w in words)


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


def cell_summaries(rows: list[dict], ranked_cells: dict[str, list[dict]]) -> list[dict]:
    """Every training cell of the report (ranked or not) for JSON: its key, runs, and each figure's median, 95 % interval
    and n, in its MLflow metric's units (energy in joules per scope); where the ranking holds it, its rank, the cell it ties with, and its result by the run rules."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "FINISHED" and not r.get("learned_nothing"):
            groups.setdefault((r["workload"], r["framework"], r["device"], r["batch_size"], r["shared_setting"]), []).append(r)
    places = {(w, c["framework"], c["device"], c["batch_size"], c["setting"]): c for w, table in ranked_cells.items() for c in table}
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        workload, framework, device, batch, setting = key
        rules = rules_of(workload)
        place = places.get(key, {})
        out.append({"workload": workload, "framework": framework, "device": device, "batch_size": batch, "setting": setting,
                    "runs": len(members), "reached": sum(rules.reached(m["time_to_target_s"]) for m in members),
                    "result": rules.verdict(len(members), sum(rules.reached(m["time_to_target_s"]) for m in members)),
                    "rank": place["rank"] if isinstance(place.get("rank"), int) else None, "ties_with": place.get("tie") or None,
                    **{k: iv.as_dict() for k, iv in cell_intervals(members, rules, shown=False).items()},
                    "energy_j": {scope: iv.as_dict() for scope, iv in cell_energy(members)["energy_intervals"].items()}})
    return out
