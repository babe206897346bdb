"""Performance profiles over a benchmark's workloads, as AlgoPerf scores its submissions: each framework on each device a submission, by time, by cost and (per energy scope) by energy to the target.

Per workload, a submission's result is its best cell's (over batch sizes and settings) median time to the workload's
quality target over its runs, a run that missed counted as the slowest (as MLPerf counts it), or its cost at that time; a
submission that has no finished, useful run of a workload, or whose median run missed its target, never reaches it there
(ratio infinite). Each result says its n, and a submission whose 95 % interval overlaps the best's ties with it. A workload counts where at
least one submission reached its target. Its ratio r = result / the best submission's; the profile
rho(tau) = the share of the workloads with r <= tau, and the score is the profile's area from tau = 1 to TAU_MAX over
(TAU_MAX - 1): 1 for a submission fastest everywhere, 0 for one never within TAU_MAX of the best.
"""

import math
from pathlib import Path

from tasks.report.intervals import Interval
from tasks.report.ranking import rules_of

TAU_MAX = 4.0
NEVER = Interval(math.inf, math.nan, math.nan, 0)  # a submission with no run of a workload
MEASURES = {"time": ("time_to_target_s", "time to target"), "cost": ("cost_to_target", "cost to target")}


def submission_of(row: dict) -> str:
    return f"{row['framework']} {row['device']}"


def results(rows: list[dict], key: str) -> dict[str, dict[str, Interval]]:
    """workload -> submission -> its best cell's (by median) ``key`` over its finished, useful runs, as a median with its 95 %
    interval and n: a run that missed the target (or reached it past max_runtime) counts as the slowest (+inf), as the
    ranking counts it; a submission with no such run, or whose median run missed, never reaches it (median +inf)."""
    cells: dict[tuple[str, str, tuple], list[float]] = {}
    for r in rows:  # a failed or useless run takes part and reaches nothing
        cell = cells.setdefault((r["workload"], submission_of(r), (r["batch_size"], r.get("setting"))), [])
        if r["status"] == "FINISHED" and not r.get("learned_nothing"):
            value = r.get(key, math.nan)
            cell.append(value if rules_of(r["workload"]).reached(r.get("time_to_target_s")) and value == value else math.inf)
    out: dict[str, dict[str, Interval]] = {}
    for (workload, submission, _), values in cells.items():
        found = Interval.of(values) if values else NEVER
        best = out.setdefault(workload, {}).get(submission, NEVER)
        out[workload][submission] = found if found.median < best.median or best is NEVER else best
    return out


def profiles(rows: list[dict], key: str = "time_to_target_s") -> dict:
    """{"workloads": the workloads scored, "ratios": submission -> workload -> r, "scores": submission -> score,
    "intervals": submission -> workload -> its result (median, interval, n), "ties": workload -> the submissions whose
    interval overlaps the best submission's (the best first; none where no other does)}."""
    found = results(rows, key)
    by_workload = {w: subs for w, subs in found.items() if any(math.isfinite(v.median) and v.median > 0 for v in subs.values())}
    submissions = sorted({s for subs in found.values() for s in subs})
    ratios = {s: {} for s in submissions}
    intervals = {s: {w: found[w].get(s, NEVER) for w in by_workload} for s in submissions}
    ties = {}
    for workload, subs in by_workload.items():
        leader = min((s for s, v in subs.items() if math.isfinite(v.median) and v.median > 0), key=lambda s: (subs[s].median, s))
        best = subs[leader].median
        for s in submissions:
            ratios[s][workload] = subs.get(s, NEVER).median / best
        tied = [s for s in sorted(subs) if s != leader and math.isfinite(subs[s].median) and subs[s].overlaps(subs[leader])]
        ties[workload] = [leader, *tied] if tied else []
    n = len(by_workload)
    scores = {s: (sum((TAU_MAX - r) for r in ratios[s].values() if r <= TAU_MAX) / (TAU_MAX - 1) / n if n else math.nan) for s in submissions}
    return {"workloads": sorted(by_workload), "ratios": ratios, "scores": scores, "intervals": intervals, "ties": ties}


def rho(ratios: dict[str, float], tau: float) -> float:
    """The share of the workloads within ``tau`` of the best."""
    return sum(r <= tau for r in ratios.values()) / len(ratios) if ratios else math.nan


def measures(rows: list[dict]) -> list[tuple[str, str, str, list[dict]]]:
    """(file stem, row key, words, the rows it scores) of each profile: by time and by cost over every row, and by energy to the
    target once per energy scope, over the runs measured in that scope only (energies of different scopes are never compared)."""
    out = [(measure, key, words, rows) for measure, (key, words) in MEASURES.items()]
    for scope in sorted({r["energy_scope"] for r in rows if r.get("energy_to_target_j", math.nan) == r.get("energy_to_target_j", math.nan)
                         and r.get("energy_scope")}):
        stem = "energy_" + scope.lower().replace(" ", "_")
        out.append((stem, "energy_to_target_j", f"energy to target ({scope})", [r for r in rows if r.get("energy_scope") == scope]))
    return out


def section(rows: list[dict], out: Path) -> tuple[list[str], list[Path]]:
    """The report's section (markdown blocks) and its figure, or nothing where fewer than two submissions or no workload can be scored."""
    blocks, figures = [], []
    for measure, key, words, scored in measures(rows):
        prof = profiles(scored, key)
        if len(prof["scores"]) < 2 or not prof["workloads"]:
            continue
        if not blocks:
            blocks.append("## Performance profiles over the workloads\n\nAs AlgoPerf scores submissions: each framework on each device is a "
                          "submission; per workload its best cell's median time (or cost) to the target over its runs (a run that missed "
                          "the target counted as the slowest), against the best submission's, with the runs it holds (n); where its 95 % "
                          "interval overlaps the best's, the two tie. ρ(τ) is the share of the workloads within τ times the best, and the score the "
                          f"area under ρ from τ = 1 to {TAU_MAX:g}, over {TAU_MAX - 1:g}: 1 for the best on every workload. A workload a "
                          "submission has no useful run of, or never reached the target on, counts as never reached. By energy, one profile "
                          "per energy scope over the runs measured in it (the run's energy over training at its mean power, until the "
                          "target), never one across scopes.\n")
        header = "| submission | score | " + " | ".join(f"{w} ratio" for w in prof["workloads"]) + " |"
        lines = [f"**By {words}** over {', '.join(prof['workloads'])}:\n", header, "|" + "---|" * (2 + len(prof["workloads"]))]
        for s, score in sorted(prof["scores"].items(), key=lambda kv: -kv[1]):
            cells = " | ".join(("never" if not math.isfinite(prof["ratios"][s][w]) else f"{prof['ratios'][s][w]:.2f}")
                               + f" ({_runs(prof['intervals'][s][w].n)})" for w in prof["workloads"])
            lines.append(f"| {s} | {score:.3f} | {cells} |")
        ties = [f"On {w}, {', '.join(t[:-1])} and {t[-1]} tie (intervals overlap)." for w, t in sorted(prof["ties"].items()) if t]
        blocks.append("\n".join(lines) + "\n" + ("\n" + " ".join(ties) + "\n" if ties else ""))
        figures.append(_figure(prof, words, out / f"performance_profile_{measure}.png"))
    return blocks, figures


def _runs(n: int) -> str:
    return "no run" if n == 0 else "1 run: no interval" if n == 1 else f"n={n}"


def _figure(prof: dict, words: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus = [1.0 + i * (TAU_MAX - 1.0) / 300 for i in range(301)]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for s, ratios in sorted(prof["ratios"].items()):
        ax.step(taus, [rho(ratios, t) for t in taus], where="post", label=f"{s} (score {prof['scores'][s]:.2f})")
    ax.set_xlabel(f"τ: {words} over the best submission's")
    ax.set_ylabel("share of workloads within τ")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"Performance profiles by {words}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
