"""Prefect task: comparison tables, figures and a Markdown report over the experiment's runs."""

import datetime as dt
import re
from pathlib import Path

from prefect import get_run_logger, task

from tasks.plots import bar_chart
from tasks.settings import Settings
from tasks.specs import AggregateSpec
from tasks.tracking import STAGE_TAG, client_for, experiment_id, mlflow_run


def _rows(client, exp_id: str, stage: str) -> list:
    return client.search_runs([exp_id], f"tags.`{STAGE_TAG}` = '{stage}'", order_by=["attributes.start_time ASC"], max_results=1000)


def study_table(results: list[dict]) -> list[dict]:
    """The study's table from training results (one dict per configuration, as train_model returns
    or as read back from MLflow): device, batch size, world size, status, time per epoch, samples/s,
    and speedup = slowest finished time per epoch / this one. Failed configurations stay in the
    table with their status."""
    rows = []
    for r in results:
        finished = r.get("status", "FINISHED") == "FINISHED" and "time_per_epoch_s" in r
        rows.append({"run": str(r.get("run_id", ""))[:8], "device": str(r.get("device_kind", r.get("device", "?"))),
                     "batch_size": int(r.get("batch_size", 0)), "world_size": int(r.get("world_size", 1)),
                     "status": "FINISHED" if finished else r.get("status", "FAILED"),
                     "time_per_epoch_s": float(r["time_per_epoch_s"]) if finished else float("nan"),
                     "samples_per_s": float(r.get("samples_per_s", float("nan"))) if finished else float("nan"),
                     "final_l1": float(r.get("final_l1", float("nan"))) if finished else float("nan")})
    done = [r["time_per_epoch_s"] for r in rows if r["status"] == "FINISHED"]
    slowest = max(done) if done else float("nan")
    for r in rows:
        r["speedup"] = slowest / r["time_per_epoch_s"] if r["status"] == "FINISHED" else float("nan")
    return sorted(rows, key=lambda r: (r["device"], r["batch_size"], r["run"]))


def pivot_markdown(rows: list[dict]) -> str:
    """Batch size down, device across: time per epoch [s] (speedup over the slowest)."""
    finished = [r for r in rows if r["status"] == "FINISHED"]
    if not finished:
        return "_no finished training runs_\n"
    devices = sorted({f"{r['device']} x{r['world_size']}" for r in finished})
    cells: dict[tuple[int, str], str] = {}
    for r in finished:  # the newest run of a cell wins (rows are sorted by run id within a cell)
        cells[(r["batch_size"], f"{r['device']} x{r['world_size']}")] = f"{r['time_per_epoch_s']:.3g} s ({r['speedup']:.2f}x)"
    lines = ["| batch size | " + " | ".join(devices) + " |", "|---|" + "---|" * len(devices)]
    for b in sorted({r["batch_size"] for r in finished}):
        lines.append(f"| {b} | " + " | ".join(cells.get((b, d), "") for d in devices) + " |")
    return "\n".join(lines) + "\n"


def training_table(runs) -> list[dict]:
    """The study's table over MLflow training runs (finished and failed)."""
    results = []
    for r in runs:
        if r.info.status not in ("FINISHED", "FAILED"):
            continue
        p, m = r.data.params, r.data.metrics
        results.append({"run_id": r.info.run_id, "device": p.get("device", "?"), "batch_size": p.get("batch_size", 0),
                        "world_size": p.get("world_size", 1), "status": r.info.status, **m})
    return study_table(results)


def quality_table(runs) -> list[dict]:
    """Time to the quality target per configuration (framework, device, batch size, recipe, target),
    MLPerf-style over its repeated runs (seeds): the mean time-to-target with the fastest and slowest
    dropped when at least three runs reached it, their spread, and how many runs never reached it."""
    groups: dict[tuple, list] = {}
    for r in runs:
        p, m = r.data.params, r.data.metrics
        if r.info.status != "FINISHED" or "train_time_s" not in m:
            continue  # runs from before time-to-target was recorded have no place here
        key = (p.get("framework", "torch"), p.get("device", "?"), int(p.get("world_size", 1)), int(p.get("batch_size", 0)),
               p.get("recipe_label", "?"), f"vorticity <= {p.get('target_vorticity', '?')} for {p.get('target_steps', '?')} steps")
        groups.setdefault(key, []).append(r)
    rows = []
    nan = float("nan")
    for (framework, device, world, batch, recipe, target), members in sorted(groups.items()):
        times = sorted(m.data.metrics["time_to_target_s"] for m in members if m.data.metrics.get("target_reached") == 1.0)
        kept = times[1:-1] if len(times) >= 3 else times
        missed = [m.info.run_id[:8] for m in members if m.data.metrics.get("target_reached") != 1.0]
        rows.append({"framework": framework, "device": f"{device} x{world}", "batch_size": batch, "recipe": recipe, "target": target,
                     "runs": len(members), "reached": len(times),
                     "time_to_target_s": sum(kept) / len(kept) if kept else nan,
                     "fastest_s": times[0] if times else nan, "slowest_s": times[-1] if times else nan,
                     "time_per_epoch_s": sorted(m.data.metrics.get("time_per_epoch_s", nan) for m in members)[len(members) // 2],
                     "not_reached": ", ".join(missed) or "-"})
    return rows


def inference_table(runs) -> list[dict]:
    """One row per finished rollout: mode x workers -> frames/s, latency split, accuracy, the solver."""
    rows = []
    nan = float("nan")
    for r in runs:
        if r.info.status != "FINISHED" or "frames_per_s" not in r.data.metrics:
            continue
        p, m = r.data.params, r.data.metrics
        rows.append({"run": r.info.run_id[:8], "mode": p.get("mode", "?"), "device": p.get("device", "?"),
                     "workers": int(p.get("workers", 1)), "tiles": int(p.get("tiles", 1)),
                     "frames_per_s": m["frames_per_s"], "cold_step_s": m.get("cold_step_s", nan),
                     "compute_s": m.get("latency_compute_s", nan), "split_merge_s": m.get("latency_split_s", nan) + m.get("latency_merge_s", nan),
                     "transfer_s": m.get("latency_transfer_s", nan), "seam_rel_error": m.get("seam_rel_error", nan),
                     "final_rel_l2_u": m.get("final_rel_l2_u", nan),
                     "final_rel_l2_vorticity": m.get("final_rel_l2_vorticity", nan),
                     "horizon_u": int(m.get("horizon_u", 0)), "horizon_vorticity": int(m.get("horizon_vorticity", 0)),
                     "regime": p.get("regime", "?"),
                     "strouhal_pred": m.get("strouhal_pred", nan), "strouhal_ref": m.get("strouhal_ref", nan),
                     "solver_frames_per_s": m.get("solver_frames_per_s", nan), "verdict": p.get("verdict", ""),
                     "surrogate_vs_solver": m.get("surrogate_vs_solver", nan)})
    rows.sort(key=lambda row: (row["device"], row["mode"], row["workers"]))
    return rows


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "_no finished runs_\n"
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


ABLATION_COLUMNS = ("one_step_rel_l2_u", "one_step_rel_l2_vorticity", "one_step_skill_u", "horizon_u", "horizon_vorticity",
                    "strouhal_rel_error", "correlation_periods", "energy_ratio_final")


def ablation_row(variant: str, trained: dict, rolled: dict) -> dict:
    """One row of the ablation table from a training result and its rollout's summary."""
    nan = float("nan")
    return {"variant": variant, "train_run": trained["run_id"][:8], "epochs": trained["epochs"],
            "train_time_s": trained.get("train_time_s", nan), "time_to_target_s": trained.get("time_to_target_s", nan),
            **{k: rolled.get(k, nan) for k in ABLATION_COLUMNS}}


@task(name="write-ablation")
def write_ablation(settings: Settings, name: str, params: dict, rows: list[dict], simulation: str) -> dict:
    """``ablation.md`` and ``ablation.json`` under the report folder, logged to an MLflow run of stage ablation."""
    import json

    out = settings.report_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    text = (f"# Training recipe ablation `{name}`\n\nEach variant trained for {params['time_budget']:g} s on dataset "
            f"`{params['dataset']}` (ngf {params['ngf']}, batch {params['batch_size']}, seed {params['seed']}), then rolled out "
            f"{params['steps']} steps on the held-out simulation `{simulation}`; horizons count steps with u error <= 0.1 "
            f"and vorticity error <= 0.3 (relative L2).\n\n" + markdown_table(rows))
    (out / "ablation.md").write_text(text)
    (out / "ablation.json").write_text(json.dumps(rows, indent=2))
    with mlflow_run(settings, "ablation", f"ablation-{name}", params=params) as run:
        for path in (out / "ablation.md", out / "ablation.json"):
            run.log_artifact(path, "ablation")
        return {"report": str(out / "ablation.md"), "rows": rows, "run_id": run.run_id}


def write_html(markdown_path: Path, title: str) -> Path:
    """``report.html`` beside ``report.md``: the same text, tables and figures, for a browser."""
    import html

    import markdown

    body = markdown.markdown(markdown_path.read_text(), extensions=["tables"])
    style = "body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 6px}"
    out = markdown_path.with_suffix(".html")
    out.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                   f"<style>{style}</style></head><body>{body}</body></html>")
    return out


def publish_artifacts(name: str, markdown: str, train_rows: list[dict], infer_rows: list[dict]) -> None:
    """The report and its tables as Prefect artifacts of the running flow (keys from the report name)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    key = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "report"
    clean = lambda rows: [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in rows]  # noqa: E731
    create_markdown_artifact(markdown=markdown, key=f"{key}-report", description=f"Kármán Bench report {name}")
    create_table_artifact(table=clean(train_rows) or [{"status": "no training runs"}], key=f"{key}-training",
                          description="Training runs: device, batch size, time per epoch, speedup")
    create_table_artifact(table=clean(infer_rows) or [{"status": "no rollouts"}], key=f"{key}-inference",
                          description="Rollouts: mode x workers -> frames/s, accuracy, solver comparison")


@task(name="aggregate-runs")
def aggregate_runs(settings: Settings, spec: AggregateSpec, parent_run_id: str | None = None) -> dict:
    logger = get_run_logger()
    client = client_for(settings)
    exp_id = experiment_id(client, settings)
    train_runs = _rows(client, exp_id, "train")
    train_rows = training_table(train_runs)
    quality_rows = quality_table(train_runs)
    infer_rows = inference_table(_rows(client, exp_id, "infer"))
    failed = [r for stage in ("generate", "train", "infer") for r in _rows(client, exp_id, stage) if r.info.status == "FAILED"]
    out = settings.report_dir(spec.name)
    out.mkdir(parents=True, exist_ok=True)
    figures: list[Path] = []
    finished = [r for r in train_rows if r["status"] == "FINISHED"]
    if finished:
        labels = [f"{r['device']} x{r['world_size']} b{r['batch_size']} ({r['run']})" for r in finished]
        figures.append(bar_chart(labels, [r["time_per_epoch_s"] for r in finished], "time per epoch [s]", out / "train_time_per_epoch.png", "training time per epoch"))
    if infer_rows:
        labels = [f"{r['mode']} {r['device']} x{r['workers']} ({r['run']})" for r in infer_rows]
        figures.append(bar_chart(labels, [r["frames_per_s"] for r in infer_rows], "frames/s", out / "infer_frames_per_s.png", "rollout throughput"))
    report = out / "report.md"
    text = [f"# Kármán Bench report `{spec.name}`\n", f"Experiment `{settings.experiment}` at `{settings.tracking_uri}`, "
            f"generated {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.\n",
            "## Time to quality\n", "Wall-clock seconds of training until the validation rollouts first meet the run's quality "
            "target (the mean over repeated runs, without the fastest and slowest when three or more reached it; "
            "fastest and slowest shown apart; runs that never reached it listed):\n", markdown_table(quality_rows),
            "## Training: device × batch size\n", "Time per epoch (speedup over the slowest configuration):\n",
            pivot_markdown(train_rows), "All training runs:\n", markdown_table(train_rows),
            "## Inference: rollout speed and accuracy against the solver\n",
            markdown_table([{k: v for k, v in r.items() if k != "verdict"} for r in infer_rows]),
            "## Is the surrogate worth it?\n", "\n".join(f"- `{r['run']}` ({r['mode']} x{r['workers']}, {r['regime']}): {r['verdict']}"
                                                        for r in infer_rows if r["verdict"]) or "_no rollout with a verdict_", "",
            f"## Failed runs\n\n{len(failed)} failed run(s)" + (": " + ", ".join(f"{r.info.run_name} ({r.info.run_id[:8]})" for r in failed) if failed else "") + "\n"]
    text += [f"![{f.stem}]({f.name})\n" for f in figures]
    report.write_text("\n".join(text))
    html_report = write_html(report, f"Kármán Bench report {spec.name}")
    publish_artifacts(spec.name, "\n".join(text), train_rows, infer_rows)
    with mlflow_run(settings, "aggregate", f"aggregate-{spec.name}", params=spec.model_dump(), parent_run_id=parent_run_id) as run:
        run.log_metrics({"train_runs": len(train_rows), "infer_runs": len(infer_rows), "failed_runs": len(failed)})
        for path in [report, html_report, *figures]:
            run.log_artifact(path, "report")
    logger.info("report with %d training and %d inference rows written to %s", len(train_rows), len(infer_rows), report)
    return {"report": str(report), "run_id": run.run_id, "train_rows": train_rows, "infer_rows": infer_rows, "quality_rows": quality_rows}
