"""Prefect task (flow process): an ablation's table, written under the report folder and logged to MLflow.

The ablate flow varies a workload's training recipe, so its rows and text are the workload's own
(``Workload.ablation``: karman's in tasks/workloads/karman/report.py); this writes and logs them."""

import json

from prefect import task

from tasks.common.config.settings import Settings
from tasks.common.tracking.runs import mlflow_run


@task(name="write-ablation")
def write_ablation(settings: Settings, name: str, params: dict, rows: list[dict], markdown: str) -> dict:
    """``ablation.md`` (``markdown``) and ``ablation.json`` (``rows``) under the report folder, logged to an MLflow run of stage ablation."""
    out = settings.report_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.md").write_text(markdown)
    (out / "ablation.json").write_text(json.dumps(rows, indent=2))
    with mlflow_run(settings, "ablation", f"ablation-{name}", params=params) as run:
        for path in (out / "ablation.md", out / "ablation.json"):
            run.log_artifact(path, "ablation")
        return {"report": str(out / "ablation.md"), "rows": rows, "run_id": run.run_id}
