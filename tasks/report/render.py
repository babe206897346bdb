"""report.md's text and figures over one benchmark's runs, and report.html beside it."""

import datetime as dt
from pathlib import Path

from tasks.common.tracking.names import Tag
from tasks.common.reports.plots import bar_chart
from tasks.common.reports.reporting import Sections, table_markdown
from tasks.common.config.settings import Settings
from tasks.common.tracking.runs import client_for, run_url
from tasks.report.capabilities import workload_of, workload_words
from tasks.report.ceiling import ceiling_section
from tasks.report.convergence import cell_of as convergence_cell
from tasks.report.convergence import check as check_convergence
from tasks.report.convergence import mark as convergence_mark
from tasks.report.convergence import section as convergence_section
from tasks.report.energy import ENERGY_NOTE, cheapest_to_target, energy_notes, scopes_line
from tasks.report.history import trend_section
from tasks.report.profiles import section as profile_section
from tasks.report.ranking import cell_summaries, ranking, ranking_columns, resumed_line, ties_line, unranked_line
from tasks.report.reading import Entry, rollout_records, training_records
from tasks.report.tables import (COMPARE_COLUMNS, QUALITY_COLUMNS, TRAIN_RESULT_COLUMNS, TRAIN_SETTINGS_COLUMNS, comparison, quality_table,
                                 train_rows)


def run_link(settings: Settings, exp_id: str, run_id: str) -> str:
    """The run's first 8 hex digits, linked to its page where the tracking store is an MLflow server."""
    if not run_id or run_id == "FAILED":
        return run_id or "–"
    if settings.tracking_uri.startswith(("http://", "https://")):
        return f"[{run_id[:8]}]({run_url(settings, run_id, exp_id)})"
    return f"`{run_id[:8]}`"


def workload_sections(trains: list[dict], rolled: list[Entry], link, out: Path) -> list[Sections]:
    """The own sections of each workload present in the runs that has them (its ``report``), in the order of
    the workloads' names, each over its own training rows and rollouts."""
    present = sorted({r["workload"] for r in trains} | {e.record.config.workload for e in rolled})
    found = []
    for name in present:
        workload = workload_of(name)
        if workload and workload.report:
            found.append(workload.report([r for r in trains if r["workload"] == name],
                                         [e for e in rolled if e.record.config.workload == name], link, out))
    return found


def failed_section(failed: list, link) -> str:
    """The failed runs, each with the one-line reason its job gave (``Tag.ERROR``): a run whose loss diverged says so here,
    and as it is not FINISHED no ranking, profile or registration takes it."""
    lines = [f"\n- {r.info.run_name} ({link(r.info.run_id)}): {r.data.tags.get(Tag.ERROR, 'no reason recorded')}" for r in failed]
    return f"## Failed runs\n\n{len(failed)} failed run(s)" + (", none ranked or registered:\n" + "".join(lines) if failed else "") + "\n"


def build_report(settings: Settings, name: str, scope: str, runs, exp_id: str, out: Path,
                 left_out: tuple[str, ...] | list[str] = ()) -> tuple[str, list[Path], dict]:
    """report.md's text and figures (written to ``out``) over ``runs``, with a line for each run of the
    scope it ``left_out`` (and why) or whose record does not read; returns the text, the figures and the tables."""
    client = client_for(settings)
    entries, unread = training_records(client, [r for r in runs if r.data.tags.get(Tag.STAGE) == "train"])
    rolled, unread_rollouts = rollout_records(client, [r for r in runs if r.data.tags.get(Tag.STAGE) == "infer"])
    left_out = [*left_out, *unread, *unread_rollouts]
    trains = train_rows(entries)
    quality = quality_table(entries)
    older = [e.run_id[:8] for e in entries + rolled if e.record.version < 2]
    failed = [r for r in runs if r.info.status == "FAILED"]
    link = lambda rid: run_link(settings, exp_id, rid)  # noqa: E731
    compared = comparison(trains)
    own = workload_sections(trains, rolled, link, out)  # each workload's own sections; their figures follow the throughput figures
    figures: list[Path] = []
    finished = [r for r in trains if r["status"] == "FINISHED"]
    workloads = sorted({r["workload"] for r in finished})
    for workload in workloads:  # one figure per workload: their samples/s differ by orders of magnitude
        mine = [r for r in finished if r["workload"] == workload]
        labels = [f"{r['framework']} {r['device']} b{r['batch_size']} s{r['seed']}" + (f" [{i + 1}]" if len(compared) > 1 else "")
                  for r in mine for i in [list(compared).index(r["setting"])]]
        stem = "train_samples_per_s" + (f"_{workload}" if len(workloads) > 1 else "")
        figures.append(bar_chart(labels, [r["samples_per_s"] for r in mine], "samples/s", out / f"{stem}.png",
                                 f"{workload_words(workload, 'title')}: training throughput"
                                 + (" (settings [1], [2], ... as in the report)" if len(compared) > 1 else "")))
    rollouts = [row for s in own for row in s.rollout_rows]
    figures += [f for s in own for f in s.figures]
    text = [f"# Kármán Bench report `{name}`\n",
            f"Covers {scope}: {len(trains)} training and {len(rollouts)} rollout runs. Experiment `{settings.experiment}` at "
            f"`{settings.tracking_uri}`, written {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}. "
            "Rows are compared only within one setting (framework, precision, recipe, widths, budget, threads, dataset); "
            "a speedup is one device over the slowest device at the same batch size and setting.\n",
            "## Training: device × batch size\n"]
    for i, (setting, table) in enumerate(compared.items(), 1):
        text += [f"**Setting [{i}]**: {setting}\n", table_markdown(table, COMPARE_COLUMNS) + scopes_line(table)]
    if not compared:
        text.append("_no finished training runs_\n")
    text += [block for s in own for block in s.training]
    verdicts = check_convergence(trains)  # every cell of a workload with reference convergence points
    ranked = ranking(trains, {convergence_cell(v | {"shared_setting": v["setting"]}): convergence_mark(v) for v in verdicts})
    for workload, table in ranked.items():
        text += [f"## {workload_words(workload, 'title')}: frameworks and devices ranked by time to target\n",
                 f"Data: {workload_words(workload, 'data')}. Target: {workload_words(workload, 'target')}, judged on the validation split "
                 "after each validation; the test scores (accuracy, macro-F1, or the shower metrics' largest relative errors) are the "
                 "held-out test split's after the last epoch. Medians over the repeated runs "
                 "(seeds) with their 95 % bootstrap interval and n (a run that missed the target counts as the slowest, as MLPerf "
                 "counts it); a cell whose time to target's interval overlaps the cell's above it ties with it and shares its rank; "
                 "TFLOPS are the network's training FLOPs at the run's samples/s, % of ceiling against the "
                 "warm matmul ceiling of the same device, framework and dtype, % of peak against the device's datasheet (CPU: derived) peak.\n",
                 table_markdown(table, ranking_columns(table)) + scopes_line(table) + ties_line(table)]
    if excluded := unranked_line(trains):
        text.append(excluded)
    if resumed := resumed_line(trains):
        text.append(resumed)
    profile_blocks, profile_figures = profile_section(trains, out)
    text += profile_blocks
    figures += profile_figures
    text += convergence_section(trains, verdicts)
    trend_blocks, trends = trend_section(client, exp_id, entries)
    text += trend_blocks
    text += ["### Every training run\n", "s/epoch is the median epoch time without the first epoch (which carries the warm-up).\n",
             table_markdown(trains, TRAIN_SETTINGS_COLUMNS, link), "Their results:\n", table_markdown(trains, TRAIN_RESULT_COLUMNS, link) + scopes_line(trains),
             ENERGY_NOTE + energy_notes(trains),
             "## Time to quality\n", "Wall-clock seconds of training until the validation rollouts first meet the run's quality "
             "target (the mean over repeated runs, without the fastest and slowest when three or more reached it), and the median "
             "with its 95 % interval and n (a run that missed counted as the slowest); energy and cost to target are medians over the runs:\n",
             table_markdown(quality, QUALITY_COLUMNS) + scopes_line(quality), cheapest_to_target(entries, link)]
    text += [block for s in own for block in s.rollouts]
    text.append(failed_section(failed, link))
    text.append(ceiling_section(client, exp_id))
    if older:
        text.append(f"Runs logged before run records existed, read back from their MLflow params: {', '.join(older)}.\n")
    if left_out:
        text.append(f"## Runs left out\n\n{len(left_out)} recorded run(s) not reported:\n" + "".join(f"\n- {line}" for line in left_out) + "\n")
    text += [f"![{f.stem}]({f.name})\n" for f in figures]
    tables = {"train_rows": trains, "infer_rows": rollouts, "quality_rows": quality, "convergence_rows": verdicts, "trend_rows": trends,
              "ranking_rows": [row | {"workload": w} for w, table in ranked.items() for row in table],
              "cell_intervals": cell_summaries(trains, ranked)}
    for s in own:
        for key, rows in s.tables.items():
            tables.setdefault(key, []).extend(rows)
    return "\n".join(text), figures, tables
