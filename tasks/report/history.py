"""A history of results per cell across code and framework versions, from the experiment's training runs, with each step beyond the noise flagged.

A cell is one training setting (workload, framework, precision, the workload's own settings, budget, threads,
data) on one device kind and world size at one batch size. A version is what ran it: the code (the git
commit, or the digest of the sources outside a checkout) and the framework's version. Versions are taken
in the order of their first run. Between consecutive versions the median of ``metric`` (seconds per epoch
by default) is compared: a change is flagged where it exceeds both ``min_change`` and three times the
larger of the two versions' spreads (each version's runs' half range over their median; 0 for one run),
so that a cell whose runs scatter needs a larger step, as asv's step detection weighs a step by the noise.
"""

import statistics

from tasks.common.tracking.names import Tag
from tasks.common.config.settings import Settings
from tasks.common.tracking.runs import client_for, experiment_id
from tasks.report.capabilities import setting_label
from tasks.report.reading import Entry, training_records

NOISE_TIMES = 3.0


def version_of(entry: Entry) -> str:
    """The code and framework version of a run, in words: 'git:abc123 torch 2.9.0' (the sources' digest where no commit)."""
    c = entry.record.config
    parts = (c.code_version or "?").split()
    commit = next((p for p in parts if p.startswith("git:")), None)
    sources = next((p for p in parts if p.startswith("src:")), "?")
    code = sources if commit is None else commit if not commit.endswith("+dirty") else f"{commit} {sources}"  # local changes: their digest too
    return f"{code} {c.framework} {c.framework_version}"


def cell_of(entry: Entry) -> str:
    c = entry.record.config
    return f"{setting_label(entry.record)} | {c.device} x{c.world_size} | batch {c.batch_size}"


def _spread(values: list[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / 2 / middle if len(values) > 1 and middle else 0.0


def history(entries: list[Entry], metric: str = "time_per_epoch_s", min_change: float = 0.10) -> list[dict]:
    """Per cell (entries in the order their runs started): each version's runs and median ``metric``, and the flagged steps
    between consecutive versions (``from``, ``to``, ``change``: the relative change of the median, ``noise``: the bound it passed)."""
    cells: dict[str, dict[str, list[float]]] = {}
    for e in entries:
        if e.status != "FINISHED" or e.record.summary is None or e.record.summary.resumes:
            continue
        value = getattr(e.record.summary, metric, None)
        if value is None or value != value:
            continue
        cells.setdefault(cell_of(e), {}).setdefault(version_of(e), []).append(float(value))
    out = []
    for cell, versions in cells.items():
        rows = [{"version": v, "runs": len(values), "median": statistics.median(values), "spread": _spread(values)} for v, values in versions.items()]
        flags = []
        for before, after in zip(rows, rows[1:]):
            change = after["median"] / before["median"] - 1
            noise = max(min_change, NOISE_TIMES * max(before["spread"], after["spread"]))
            if abs(change) > noise:
                flags.append({"from": before["version"], "to": after["version"], "change": change, "noise": noise})
        out.append({"cell": cell, "metric": metric, "versions": rows, "flags": flags})
    return out


BARS = "▁▂▃▄▅▆▇█"
TREND_COLUMNS = {"cell": "cell", "versions": "versions (runs)", "trend": "trend", "medians": "s/epoch by version", "change": "change"}


def sparkline(values: list[float]) -> str:
    """``values`` as a small bar per value, from the smallest (▁) to the largest (█) of them."""
    low, high = min(values), max(values)
    return "".join(BARS[0 if high == low else round((v - low) / (high - low) * (len(BARS) - 1))] for v in values)


def trend_rows(cells: list[dict]) -> list[dict]:
    """One row per cell of ``history``'s result that ran at more than one version: its versions, a sparkline of their medians, and each
    flagged step with the versions on both sides."""
    rows = []
    for c in cells:
        if len(c["versions"]) < 2:
            continue
        medians = [v["median"] for v in c["versions"]]
        steps = "; ".join(f"**{f['change']:+.0%}** ({f['from']} → {f['to']}, beyond {f['noise']:.0%})" for f in c["flags"])
        # the cell's parts joined by a dot: a pipe would end the table's cell
        rows.append({"cell": c["cell"].replace(" | ", " · "), "versions": " → ".join(f"{v['version']} ({v['runs']})" for v in c["versions"]),
                     "trend": sparkline(medians), "medians": " → ".join(f"{m:.3g}" for m in medians), "change": steps or "within the noise",
                     "flagged": bool(c["flags"])})
    return rows


def trend_section(client, exp_id: str, entries: list[Entry], min_change: float = 0.10) -> tuple[list[str], list[dict]]:
    """The report's history of its own cells: per cell of ``entries``, its seconds per epoch at every code and framework version the
    experiment's training runs of its workload recorded, a sparkline, and each step beyond the noise flagged with the versions on both
    sides (``python -m flows history``'s test). Returns the blocks and the rows."""
    mine = {cell_of(e) for e in entries if e.status == "FINISHED" and e.record.summary is not None}
    if not mine:
        return [], []
    runs = []
    for workload in sorted({e.record.config.workload for e in entries}):
        runs += client.search_runs([exp_id], f"tags.`{Tag.STAGE}` = 'train' and tags.`{Tag.WORKLOAD}` = '{workload}'",
                                   order_by=["attributes.start_time ASC"], max_results=5000)
    past, _ = training_records(client, sorted(runs, key=lambda r: r.info.start_time))
    rows = trend_rows([c for c in history(past, min_change=min_change) if c["cell"] in mine])
    blocks = ["## History of these cells\n",
              "Each cell's median seconds per epoch at every code and framework version its workload's training runs in this "
              f"experiment recorded, oldest first (the code's git commit or sources' digest, and the framework's version); a step "
              f"between consecutive versions is flagged where it passes {min_change:.0%} and three times the larger of the two "
              "versions' spreads (`python -m flows history` lists every cell of the experiment).\n"]
    if rows:
        from tasks.common.reports.reporting import table_markdown

        blocks.append(table_markdown(rows, TREND_COLUMNS))
    else:
        blocks.append("Every cell of this report ran at one code and framework version so far: no history to compare.\n")
    return blocks, rows


def history_of_experiment(settings: Settings, metric: str, min_change: float) -> dict:
    """``history`` over every training run of the settings' experiment."""
    client = client_for(settings)
    runs = client.search_runs([experiment_id(client, settings)], f"tags.`{Tag.STAGE}` = 'train'", order_by=["attributes.start_time ASC"],
                              max_results=5000)
    entries, unread = training_records(client, runs)
    cells = history(entries, metric, min_change)
    return {"metric": metric, "min_change": min_change, "cells": cells, "flagged": [c for c in cells if c["flags"]], "unread": unread}
