"""Prefect task (flow process): comparison tables, figures and a Markdown/HTML report over one benchmark's runs.

The report's parts live by job beside this module: reading.py (the runs and their records), tables.py, energy.py,
ranking.py, render.py (report.md and report.html) and ablation.py; a workload's own sections live in its folder
(tasks.workloads.Workload.report)."""

import math
import re

from prefect import get_run_logger, task

from tasks.common.reports.reporting import embed, fmt, write_html
from tasks.common.config.settings import Settings
from tasks.common.stores.store import write_json_atomic
from tasks.common.specs import AggregateSpec
from tasks.common.tracking.runs import client_for, experiment_id, mlflow_run
from tasks.report.ablation import write_ablation
from tasks.report.intervals import CONFIDENCE, SEED
from tasks.report.reading import check_report_source, covered_runs
from tasks.report.render import build_report

# The flows import these from here: the CLI's check before a report, and the ablate flow's rows and writer.
__all__ = ["aggregate_runs", "cell_intervals", "interval_metrics", "check_report_source", "convergence_verdicts", "publish_artifacts", "write_ablation"]

CONVERGENCE_FILE = "convergence.json"  # beside report.md: each judged cell's verdict against its reference convergence points
INTERVALS_FILE = "intervals.json"  # beside report.md: each training cell's medians with their 95 % intervals and n


def convergence_verdicts(report: str) -> list[dict]:
    """The convergence verdicts written beside the report ``report`` (report.md's path); [] where none were."""
    return _cells_beside(report, CONVERGENCE_FILE)


def cell_intervals(report: str) -> list[dict]:
    """Each training cell's figures (median, 95 % interval, n) written beside the report ``report``; [] where none were."""
    return _cells_beside(report, INTERVALS_FILE)


def interval_metrics(cells: list[dict]) -> dict[str, float]:
    """The cells of ``cell_intervals`` as MLflow metrics, so that a benchmark's run shows them: ``<cell> <figure> median|low|high|n``
    (a cell is workload, framework, device and batch size; energy names its scope); a bound that is none or not reached is left out."""
    out: dict[str, float] = {}
    seen: dict[str, int] = {}
    for cell in cells:
        name = f"{cell['workload']} {cell['framework']} {cell['device']} b{cell['batch_size']}"
        seen[name] = seen.get(name, 0) + 1
        name += f" setting-{seen[name]}" if seen[name] > 1 else ""  # the same cell in another setting (MLflow's names take no brackets)
        out[f"{name} runs"] = cell["runs"]
        figures = {k: v for k, v in cell.items() if isinstance(v, dict) and "median" in v}
        figures |= {f"energy_j {scope}": v for scope, v in cell["energy_j"].items()}
        for figure, interval in figures.items():
            out |= {f"{name} {figure} {part}": interval[part] for part in ("median", "low", "high", "n")
                    if isinstance(interval[part], (int, float))}
    return out


def _cells_beside(report: str, name: str) -> list[dict]:
    import json
    from pathlib import Path

    path = Path(report).parent / name
    return json.loads(path.read_text())["cells"] if path.is_file() else []


ARTIFACT_COLUMNS = 8  # columns of one table artifact at the most: wider ones run off the right edge of Prefect's artifact view


def narrow_tables(rows: list[dict], width: int = ARTIFACT_COLUMNS) -> list[list[dict]]:
    """``rows`` as tables of at most ``width`` columns, cells formatted: the columns that hold a value in some row, in their
    order, ``width - 1`` a table after the first column (the run), which every table repeats so that its rows join up."""
    if not rows:
        return []
    cells = [{k: fmt(v) for k, v in r.items() if k not in ("setting", "shared_setting", "target")} for r in rows]
    key, *rest = [c for c in cells[0] if any(row.get(c, "–") not in ("–", "") for row in cells)] or list(cells[0])[:1]
    step = max(1, width - 1)
    return [[{c: row.get(c, "–") for c in (key, *rest[i:i + step])} for row in cells] for i in range(0, max(len(rest), 1), step)]


def publish_artifacts(report: dict) -> None:
    """The report that ``aggregate_runs`` returned (figures inline) and its tables as Prefect artifacts of the
    running flow, under keys from the report's name; called once per report, by the flow whose run owns it. A wide
    table is published in parts of ``ARTIFACT_COLUMNS`` columns (``-training``, ``-training-2``, ...), each keyed by the run."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    name = report["name"]
    key = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "report"
    create_markdown_artifact(markdown=report["markdown"], key=f"{key}-report", description=f"Kármán Bench report {name}")
    for kind, rows, what, empty in (("training", report["train_rows"], "Training runs: setting, device, batch size, time per epoch, results",
                                     "no training runs"),
                                    ("inference", report["infer_rows"], "Rollouts: mode x workers -> frames/s, accuracy, solver comparison",
                                     "no rollouts")):
        parts = narrow_tables(rows) or [[{"status": empty}]]
        for i, table in enumerate(parts, 1):
            create_table_artifact(table=table, key=f"{key}-{kind}" + (f"-{i}" if i > 1 else ""),
                                  description=what + (f" (part {i} of {len(parts)}, joined by run)" if len(parts) > 1 else ""))


@task(name="aggregate-runs", task_run_name="report {spec.name}")
def aggregate_runs(settings: Settings, spec: AggregateSpec, parent_run_id: str | None = None) -> dict:
    """report.md, report.html and figures under the report folder, over the runs the spec names,
    logged to an aggregate MLflow run; the flow that owns the report publishes it (publish_artifacts)."""
    logger = get_run_logger()
    client = client_for(settings)
    exp_id = experiment_id(client, settings)
    scope, runs, left_out = covered_runs(settings, client, exp_id, spec.runs)
    for line in left_out:
        logger.warning("report %s leaves out run %s", spec.name, line)
    out = settings.report_dir(spec.name)
    out.mkdir(parents=True, exist_ok=True)
    text, figures, tables = build_report(settings, spec.name, scope, runs, exp_id, out, left_out)
    report = out / "report.md"
    report.write_text(text)
    html_report = write_html(report, f"Kármán Bench report {spec.name}")
    embedded = embed(text, out)
    verdicts = out / CONVERGENCE_FILE
    finite = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731  (JSON has no NaN or infinity)
    write_json_atomic(verdicts, {"cells": [{k: finite(v) for k, v in c.items() if k != "setting"} for c in tables["convergence_rows"]]})
    intervals = out / INTERVALS_FILE
    write_json_atomic(intervals, {"confidence": CONFIDENCE, "statistic": "median", "method": "percentile bootstrap", "seed": SEED,
                                  "cells": tables["cell_intervals"]})
    with mlflow_run(settings, "aggregate", f"aggregate-{spec.name}", params=spec.model_dump(), parent_run_id=parent_run_id,
                    description=f"Report `{spec.name}` over {scope}.") as run:
        run.log_metrics({"train_runs": len(tables["train_rows"]), "infer_runs": len(tables["infer_rows"])})
        for path in [report, html_report, verdicts, intervals, *figures]:
            run.log_artifact(path, "report")
    logger.info("report over %s: %d training and %d rollout rows, written to %s", scope, len(tables["train_rows"]),
                len(tables["infer_rows"]), report)
    return {"name": spec.name, "report": str(report), "html": str(html_report), "markdown": embedded, "figures": [str(f) for f in figures],
            "intervals": str(intervals),
            "run_id": run.run_id, "scope": scope, **tables}
