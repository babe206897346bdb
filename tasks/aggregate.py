"""Prefect task: comparison tables, figures and a Markdown report over the experiment's runs."""

import datetime as dt
from pathlib import Path

from prefect import get_run_logger, task

from tasks.plots import bar_chart
from tasks.settings import Settings
from tasks.specs import AggregateSpec
from tasks.tracking import STAGE_TAG, client_for, experiment_id, mlflow_run


def _rows(client, exp_id: str, stage: str) -> list:
    return client.search_runs([exp_id], f"tags.`{STAGE_TAG}` = '{stage}'", order_by=["attributes.start_time ASC"], max_results=1000)


def training_table(runs) -> list[dict]:
    """One row per finished training run: device, batch size, time per epoch, samples/s, speedup
    over the slowest configuration."""
    rows = []
    for r in runs:
        if r.info.status != "FINISHED" or "time_per_epoch_s" not in r.data.metrics:
            continue
        p, m = r.data.params, r.data.metrics
        rows.append({"run": r.info.run_id[:8], "device": p.get("device", "?"), "batch_size": int(p.get("batch_size", 0)),
                     "world_size": p.get("world_size", "1"), "time_per_epoch_s": m["time_per_epoch_s"],
                     "samples_per_s": m.get("samples_per_s", float("nan")), "final_l1": m.get("final_l1", float("nan"))})
    if rows:
        slowest = max(r["time_per_epoch_s"] for r in rows)
        for r in rows:
            r["speedup"] = slowest / r["time_per_epoch_s"]
    return sorted(rows, key=lambda r: (r["device"], r["batch_size"]))


def inference_table(runs) -> list[dict]:
    rows = []
    for r in runs:
        if r.info.status != "FINISHED" or "frames_per_s" not in r.data.metrics:
            continue
        p, m = r.data.params, r.data.metrics
        rows.append({"run": r.info.run_id[:8], "mode": p.get("mode", "?"), "device": p.get("device", "?"),
                     "frames_per_s": m["frames_per_s"], "cold_step_s": m.get("cold_step_s", float("nan")),
                     "final_rel_l2_u": m.get("final_rel_l2_u", float("nan")),
                     "final_rel_l2_vorticity": m.get("final_rel_l2_vorticity", float("nan")),
                     "steps_below_threshold": int(m.get("steps_below_threshold", 0))})
    return rows


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "_no finished runs_\n"
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


@task(name="aggregate-runs")
def aggregate_runs(settings: Settings, spec: AggregateSpec, parent_run_id: str | None = None) -> dict:
    logger = get_run_logger()
    client = client_for(settings)
    exp_id = experiment_id(client, settings)
    train_rows = training_table(_rows(client, exp_id, "train"))
    infer_rows = inference_table(_rows(client, exp_id, "infer"))
    failed = [r for stage in ("generate", "train", "infer") for r in _rows(client, exp_id, stage) if r.info.status == "FAILED"]
    out = settings.report_dir(spec.name)
    out.mkdir(parents=True, exist_ok=True)
    figures: list[Path] = []
    if train_rows:
        labels = [f"{r['device']} b{r['batch_size']} ({r['run']})" for r in train_rows]
        figures.append(bar_chart(labels, [r["time_per_epoch_s"] for r in train_rows], "time per epoch [s]", out / "train_time_per_epoch.png", "training time per epoch"))
    if infer_rows:
        labels = [f"{r['mode']} {r['device']} ({r['run']})" for r in infer_rows]
        figures.append(bar_chart(labels, [r["frames_per_s"] for r in infer_rows], "frames/s", out / "infer_frames_per_s.png", "rollout throughput"))
    report = out / "report.md"
    text = [f"# Kármán Bench report `{spec.name}`\n", f"Experiment `{settings.experiment}` at `{settings.tracking_uri}`, "
            f"generated {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.\n",
            "## Training: device × batch size\n", markdown_table(train_rows),
            "## Inference: rollout speed and accuracy against the solver\n", markdown_table(infer_rows),
            f"## Failed runs\n\n{len(failed)} failed run(s)" + (": " + ", ".join(f"{r.info.run_name} ({r.info.run_id[:8]})" for r in failed) if failed else "") + "\n"]
    text += [f"![{f.stem}]({f.name})\n" for f in figures]
    report.write_text("\n".join(text))
    with mlflow_run(settings, "aggregate", f"aggregate-{spec.name}", params=spec.model_dump(), parent_run_id=parent_run_id) as run:
        run.log_metrics({"train_runs": len(train_rows), "infer_runs": len(infer_rows), "failed_runs": len(failed)})
        for path in [report, *figures]:
            run.log_artifact(path, "report")
    logger.info("report with %d training and %d inference rows written to %s", len(train_rows), len(infer_rows), report)
    return {"report": str(report), "run_id": run.run_id, "train_rows": train_rows, "infer_rows": infer_rows}
