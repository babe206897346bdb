"""Prefect task (flow process): comparison tables, figures and a Markdown/HTML report over one benchmark's runs.

The report's parts live by job beside this module: reading.py (the runs and their records), tables.py, energy.py,
ranking.py, render.py (report.md and report.html) and ablation.py; a workload's own sections live in its folder
(tasks.workloads.Workload.report)."""

import math
import re

from prefect import get_run_logger, task

from tasks.common.reporting import fmt
from tasks.common.settings import Settings
from tasks.common.store import write_json_atomic
from tasks.common.specs import AggregateSpec
from tasks.common.tracking import client_for, experiment_id, mlflow_run
from tasks.report.ablation import ablation_row, write_ablation
from tasks.report.reading import check_report_source, covered_runs
from tasks.report.render import build_report, embed, write_html

# The flows import these from here: the CLI's check before a report, and the ablate flow's rows and writer.
__all__ = ["ablation_row", "aggregate_runs", "check_report_source", "convergence_verdicts", "publish_artifacts", "write_ablation"]

CONVERGENCE_FILE = "convergence.json"  # beside report.md: each judged cell's verdict against its reference convergence points


def convergence_verdicts(report: str) -> list[dict]:
    """The convergence verdicts written beside the report ``report`` (report.md's path); [] where none were."""
    import json
    from pathlib import Path

    path = Path(report).parent / CONVERGENCE_FILE
    return json.loads(path.read_text())["cells"] if path.is_file() else []


def publish_artifacts(report: dict) -> None:
    """The report that ``aggregate_runs`` returned (figures inline) and its tables as Prefect artifacts of the
    running flow, under keys from the report's name; called once per report, by the flow whose run owns it."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    name = report["name"]
    key = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "report"
    clean = lambda rows: [{k: fmt(v) for k, v in r.items() if k not in ("setting", "shared_setting", "target")} for r in rows]  # noqa: E731
    create_markdown_artifact(markdown=report["markdown"], key=f"{key}-report", description=f"Kármán Bench report {name}")
    create_table_artifact(table=clean(report["train_rows"]) or [{"status": "no training runs"}], key=f"{key}-training",
                          description="Training runs: setting, device, batch size, time per epoch")
    create_table_artifact(table=clean(report["infer_rows"]) or [{"status": "no rollouts"}], key=f"{key}-inference",
                          description="Rollouts: mode x workers -> frames/s, accuracy, solver comparison")


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
    verdicts = out / CONVERGENCE_FILE
    finite = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731  (JSON has no NaN or infinity)
    write_json_atomic(verdicts, {"cells": [{k: finite(v) for k, v in c.items() if k != "setting"} for c in tables["convergence_rows"]]})
    html_report = write_html(report, f"Kármán Bench report {spec.name}")
    embedded = embed(text, out)
    with mlflow_run(settings, "aggregate", f"aggregate-{spec.name}", params=spec.model_dump(), parent_run_id=parent_run_id,
                    description=f"Report `{spec.name}` over {scope}.") as run:
        run.log_metrics({"train_runs": len(tables["train_rows"]), "infer_runs": len(tables["infer_rows"])})
        for path in [report, html_report, verdicts, *figures]:
            run.log_artifact(path, "report")
    logger.info("report over %s: %d training and %d rollout rows, written to %s", scope, len(tables["train_rows"]),
                len(tables["infer_rows"]), report)
    return {"name": spec.name, "report": str(report), "html": str(html_report), "markdown": embedded, "figures": [str(f) for f in figures],
            "run_id": run.run_id, "scope": scope, **tables}
