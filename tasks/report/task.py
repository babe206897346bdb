"""Prefect task (flow process): comparison tables, figures and a Markdown/HTML report over one benchmark's runs."""

import datetime as dt
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task

from tasks.common.names import Tag
from tasks.common.records import RECORD_FILE, RolloutRecord, TrainRecord
from tasks.common.plots import bar_chart
from tasks.common.settings import Settings
from tasks.common.specs import AggregateSpec
from tasks.common.tables import markdown_table
from tasks.common.tracking import client_for, experiment_id, missing, mlflow_run, run_url
from tasks.report.ceiling import ceiling_section

# MlflowException is imported in the functions that catch it: Dask workers import the flows' modules and need no MLflow.


def _rows(client, exp_id: str, stage: str) -> list:
    return client.search_runs([exp_id], f"tags.`{Tag.STAGE}` = '{stage}'", order_by=["attributes.start_time ASC"], max_results=1000)


def quality_table(entries: list["Entry"]) -> list[dict]:
    """Time to the quality target per configuration (workload, framework, device, batch size, setting, target),
    MLPerf-style over its repeated runs (seeds): the mean time-to-target with the fastest and slowest
    dropped when at least three runs reached it, their spread, and how many runs never reached it."""
    groups: dict[tuple, list] = {}
    for e in entries:
        if e.status != "FINISHED" or e.record.summary is None:
            continue
        c = e.record.config
        key = (c.framework, c.device, c.world_size, c.batch_size, c.workload_params.get("recipe_label", c.workload), target_words(e.record))
        groups.setdefault(key, []).append(e)
    rows = []
    nan = float("nan")
    for (framework, device, world, batch, recipe, target), members in sorted(groups.items()):
        times = sorted(m.record.summary.time_to_target_s for m in members if m.record.summary.target_reached)
        kept = times[1:-1] if len(times) >= 3 else times
        missed = [m.run_id[:8] for m in members if not m.record.summary.target_reached]
        rows.append({"framework": framework, "device": f"{device} x{world}", "batch_size": batch, "recipe": recipe, "target": target,
                     "runs": len(members), "reached": len(times),
                     "time_to_target_s": sum(kept) / len(kept) if kept else nan,
                     "fastest_s": times[0] if times else nan, "slowest_s": times[-1] if times else nan,
                     "time_per_epoch_s": sorted(m.record.summary.time_per_epoch_s for m in members)[len(members) // 2],
                     "not_reached": ", ".join(missed) or "-",
                     **cell_energy([_energy(m.record.energy) for m in members]),
                     "cost_to_target": _money([(m.record.energy.cost_of(m.record.summary.time_to_target_s), m.record.energy.currency)
                                               for m in members if m.record.summary.target_reached and m.record.energy is not None])})
    return rows


def target_words(record: TrainRecord) -> str:
    """A training run's quality target in words: its spec's where its workload takes one from the spec, else its table's."""
    from tasks.common.errors import UserError
    from tasks.workloads import get_workload

    try:
        return get_workload(record.config.workload).target_of(record.config.spec)
    except UserError:
        return record.config.workload


def _energy(energy) -> dict:
    """A run's energy and cost as table fields: joules (NaN where not measured), the reason it was not, device-hours, cost."""
    nan = float("nan")
    if energy is None:  # a run logged before energy was measured
        return {"energy_j": nan, "energy": "–", "energy_unavailable": "", "device_hours": nan, "cost": nan, "currency": "", "cost_text": "–"}
    measured = energy.joules is not None
    return {"energy_j": energy.joules if measured else nan, "energy": f"{fmt(energy.joules)} J" if measured else "unavailable",
            "energy_unavailable": "" if measured else energy.source.removeprefix("unavailable: "),
            "device_hours": energy.device_hours, "cost": energy.cost, "currency": energy.currency, "cost_text": f"{fmt(energy.cost)} {energy.currency}"}


def _money(amounts: list[tuple[float, str]]) -> str:
    """The median of (amount, currency) pairs with its currency (several currencies: named together); '–' for none."""
    import statistics

    if not amounts:
        return "–"
    return f"{fmt(statistics.median(a for a, _ in amounts))} {'/'.join(sorted({c for _, c in amounts}))}"


def cell_energy(members: list[dict]) -> dict:
    """A cell's energy and cost over its runs (rows of _energy's fields): the median joules of the runs that measured
    them ('unavailable' where none could), the median cost."""
    import statistics

    joules = [m["energy_j"] for m in members if m["energy_j"] == m["energy_j"]]
    energy = f"{fmt(statistics.median(joules))} J" if joules else "unavailable" if any(m["energy_unavailable"] for m in members) else "–"
    return {"energy": energy, "cost_text": _money([(m["cost"], m["currency"]) for m in members if m["cost"] == m["cost"]])}


def energy_notes(rows: list[dict]) -> str:
    """One line per reason a run's energy is unavailable, naming its runs; '' when every run measured it."""
    reasons: dict[str, list[str]] = {}
    for r in rows:
        if r["energy_unavailable"]:
            reasons.setdefault(r["energy_unavailable"], []).append(r["run"][:8])
    return "".join(f"Energy unavailable for {', '.join(runs)}: {reason}.\n" for reason, runs in reasons.items())


def cheapest_to_target(entries: list["Entry"], link=lambda rid: rid[:8]) -> str:
    """Per workload and quality target, the run whose devices reached the target for the least money (price per
    device-hour x devices x time to target), or a plain statement that no run reached it."""
    best: dict[tuple[str, str], tuple[float, "Entry"]] = {}
    targets = set()
    for e in entries:
        s, energy = e.record.summary, e.record.energy
        if e.status != "FINISHED" or s is None:
            continue
        key = (e.record.config.workload, target_words(e.record))
        targets.add(key)
        if s.target_reached and s.time_to_target_s is not None and energy is not None:
            cost = energy.cost_of(s.time_to_target_s)
            if key not in best or cost < best[key][0]:
                best[key] = (cost, e)
    if not targets:
        return "**Cheapest device to the quality target**: no finished training run, so none is named.\n"
    lines = []
    for workload, target in sorted(targets):
        if (workload, target) not in best:
            lines.append(f"- {workload} ({target}): no run reached the target, so no device is named.")
            continue
        cost, e = best[(workload, target)]
        c, energy, s = e.record.config, e.record.energy, e.record.summary
        lines.append(f"- {workload} ({target}): **{c.device} x{c.world_size}** ({c.framework}, batch {c.batch_size}, run {link(e.run_id)}) "
                     f"for {fmt(cost)} {energy.currency}: {fmt(energy.price_per_device_hour)} {energy.currency} per device-hour x "
                     f"{fmt(energy.devices)} device(s) x {fmt(s.time_to_target_s)} s to the target.")
    return "**Cheapest device to the quality target** (at the price table's prices; among the runs that reached it):\n\n" + "\n".join(lines) + "\n"


ABLATION_COLUMNS = ("one_step_rel_l2_u", "one_step_rel_l2_vorticity", "one_step_skill_u", "one_step_skill_vorticity", "horizon_u", "horizon_vorticity",
                    "strouhal_rel_error", "correlation_periods", "energy_ratio_final", "horizon_vorticity_lagged", "frequency_rel_error_phase")


# The long rollouts' scores an ablation row keeps: the worst over the extra simulations, each by its own sense of worse.
LONG_COLUMNS = {"horizon_u": min, "horizon_vorticity": min, "horizon_vorticity_lagged": min, "horizon_vorticity_lowpass": min,
                "correlation_periods": min,
                "energy_ratio_max_deviation": max, "shedding_amplitude_ratio": lambda values: max(values, key=lambda a: abs(a - 1)),
                "frequency_rel_error_phase": lambda values: max(values, key=abs)}


def ablation_row(variant: str, seed: int, trained: dict, rolled: dict, long: list[dict]) -> dict:
    """One row of the ablation table from a training result, its rollout on the test simulation and its
    ``long`` rollouts (columns ``long_*``: the worst over them; NaN where there are none or a score is missing)."""
    nan = float("nan")
    worst = {}
    for key, pick in LONG_COLUMNS.items():
        values = [r[key] for r in long if r.get(key) is not None and r[key] == r[key]]
        worst[f"long_{key}"] = pick(values) if values and len(values) == len(long) else nan
    return {"variant": variant, "seed": seed, "train_run": trained["run_id"][:8], "epochs": trained["epochs"],
            "train_time_s": trained.get("train_time_s", nan), "time_to_target_s": trained.get("time_to_target_s", nan),
            **{k: rolled.get(k, nan) for k in ABLATION_COLUMNS}, **worst}


def ablation_medians(rows: list[dict]) -> list[dict]:
    """Per variant (in the rows' order): its finished runs and the median over them of every numeric column
    (NaN where no run has a value)."""
    import statistics

    out = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        done = [r for r in rows if r["variant"] == variant and r["train_run"] != "FAILED"]
        row = {"variant": variant, "runs": len(done)}
        for key in (k for k in rows[0] if k not in ("variant", "seed", "train_run")):
            values = [r[key] for r in done if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
            row[key] = float(statistics.median(values)) if values else float("nan")
        out.append(row)
    return out


@task(name="write-ablation")
def write_ablation(settings: Settings, name: str, params: dict, rows: list[dict], simulation: str, extra: list[str] = ()) -> dict:
    """``ablation.md`` and ``ablation.json`` under the report folder, logged to an MLflow run of stage ablation."""
    import json

    out = settings.report_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    seeds = ", ".join(str(s) for s in sorted({r["seed"] for r in rows}))

    def shown(row: dict) -> dict:  # the long_ columns where there were long rollouts
        return {k: v for k, v in row.items() if extra or not k.startswith("long_")}

    long = (f" Each model was also rolled out {params['extra_steps']} steps on every simulation of dataset "
            f"`{params['extra_dataset']}` ({', '.join(extra)}); the `long_` columns are the worst over those rollouts "
            f"(the shortest horizon, the largest energy deviation and frequency error, the shedding amplitude farthest from 1)."
            if extra else "")
    text = (f"# Training recipe ablation `{name}`\n\nEach variant trained for {params['time_budget']:g} s on dataset "
            f"`{params['dataset']}` (ngf {params['ngf']}, batch {params['batch_size']}, seeds {seeds}), then rolled out "
            f"{params['steps']} steps on the held-out simulation `{simulation}`; horizons count steps with u error <= 0.1 "
            f"and vorticity error <= 0.3 (relative L2).{long}\n\n"
            + markdown_table([shown(r) for r in rows]))
    if len({r["seed"] for r in rows}) > 1:
        text += "\n## Medians over the seeds\n\nPer variant, the median of each column over its runs that finished.\n\n"
        text += markdown_table([shown(m) for m in ablation_medians(rows)])
    (out / "ablation.md").write_text(text)
    (out / "ablation.json").write_text(json.dumps(rows, indent=2))
    with mlflow_run(settings, "ablation", f"ablation-{name}", params=params) as run:
        for path in (out / "ablation.md", out / "ablation.json"):
            run.log_artifact(path, "ablation")
        return {"report": str(out / "ablation.md"), "rows": rows, "run_id": run.run_id}


def write_html(markdown_path: Path, title: str) -> Path:
    """``report.html`` beside ``report.md``: the same text, tables and figures (inline, so that it
    reads alone, in a browser or in MLflow's artifact preview)."""
    import html

    import markdown

    body = markdown.markdown(_embed(markdown_path.read_text(), markdown_path.parent), extensions=["tables"])
    style = "body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 6px}"
    out = markdown_path.with_suffix(".html")
    out.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                   f"<style>{style}</style></head><body>{body}</body></html>")
    return out


def fmt(value) -> str:
    """A table cell: '–' for nothing or NaN, integers as they are, other numbers to about three
    significant digits (no exponent below a million)."""
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 100:
        return f"{int(value):,}" if abs(value) >= 10_000 else str(int(value))
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value:.3g}"
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def run_link(settings: Settings, exp_id: str, run_id: str) -> str:
    """The run's first 8 hex digits, linked to its page where the tracking store is an MLflow server."""
    if not run_id or run_id == "FAILED":
        return run_id or "–"
    if settings.tracking_uri.startswith(("http://", "https://")):
        return f"[{run_id[:8]}]({run_url(settings, run_id, exp_id)})"
    return f"`{run_id[:8]}`"


def table_markdown(rows: list[dict], columns: dict[str, str], links=None) -> str:
    """A Markdown table of ``rows`` with ``columns`` (key -> header); ``links`` turns a run id into a cell."""
    if not rows:
        return "_none_\n"
    cell = lambda key, value: links(value) if links and key.endswith("run") else fmt(value)  # noqa: E731
    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(k, r.get(k)) for k in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Entry:
    """A run as the report reads it: MLflow's facts of the run and its typed record (TrainRecord or RolloutRecord)."""

    run_id: str
    run_name: str
    status: str
    error: str
    record: TrainRecord | RolloutRecord


def read_records(client, runs, kind: type[TrainRecord] | type[RolloutRecord], finished_by: str) -> tuple[list[Entry], list[str]]:
    """The record of every finished or failed run: its record.json, or for a run logged before records
    existed, the record read back from its params (``finished_by``: the metric a finished run of that
    version has). Also one line for each run left out and why."""
    from pydantic import ValidationError

    entries, left_out = [], []
    for r in runs:
        if r.info.status not in ("FINISHED", "FAILED"):
            continue
        finished = r.info.status == "FINISHED" and finished_by in r.data.metrics
        try:
            if any(a.path == RECORD_FILE for a in client.list_artifacts(r.info.run_id)):
                with tempfile.TemporaryDirectory() as tmp:
                    record = kind.model_validate_json(Path(client.download_artifacts(r.info.run_id, RECORD_FILE, tmp)).read_text())
            elif kind is TrainRecord:
                record = TrainRecord.from_mlflow(r.data.params, r.data.metrics, finished)
            else:
                record = RolloutRecord.from_mlflow(r.data.params, r.data.metrics, r.data.tags, finished)
        except ValidationError as exc:
            left_out.append(f"{r.info.run_name} ({r.info.run_id[:8]}): its record does not read ({exc.errors()[0]['msg']})")
            continue
        status = "FINISHED" if finished and record.summary is not None else "FAILED"
        entries.append(Entry(r.info.run_id, r.info.run_name or "", status, r.data.tags.get(Tag.ERROR, "")[:120], record))
    return entries, left_out


def training_records(client, runs) -> tuple[list[Entry], list[str]]:
    """The records of training runs (see read_records)."""
    return read_records(client, runs, TrainRecord, "time_per_epoch_s")


def _workload_words(name: str, what: str) -> str:
    """A workload's ``what`` (title, target) from the table; the bare name where this process does not know it."""
    from tasks.common.errors import UserError
    from tasks.workloads import get_workload

    try:
        return getattr(get_workload(name), what)
    except UserError:
        return name


def _budget(spec) -> str:
    if spec.time_budget is not None:
        return f"{spec.time_budget:g} s"
    if spec.max_steps is not None:
        return f"{spec.max_steps} steps"
    return f"{spec.epoch_limit} epochs"


def setting_label(record: TrainRecord, framework: bool = True) -> str:
    """What a training run's setting is, in words: workload, framework (unless not asked for), precision, the
    workload's own settings (recipe, widths), budget, threads, data."""
    from tasks.common.errors import UserError
    from tasks.workloads import get_workload

    c = record.config
    try:
        own = get_workload(c.workload).setting(c.spec)
    except UserError:  # a workload this process does not know: its recorded label
        own = str(c.workload_params.get("recipe_label", "?"))
    parts = [c.workload] + ([c.framework] if framework else []) + [c.spec.precision, own, f"budget {_budget(c.spec)}"]
    if c.threads:
        parts.append(f"{c.threads} CPU thread{'s' if c.threads > 1 else ''}")
    if c.dataset_digest:
        parts.append(f"data {c.dataset_digest[:8]}")
    return ", ".join(parts)


def _number(value: float | None) -> float:
    return float("nan") if value is None else value


def train_rows(entries: list[Entry]) -> list[dict]:
    """One row per training run (finished or failed) with the settings that define it."""
    rows = []
    nan = float("nan")
    for e in entries:
        c, s = e.record.config, e.record.summary
        done = e.status == "FINISHED"
        main_loss = s.final_losses.get("loss_l1", next(iter(s.final_losses.values()), None)) if done else None
        rows.append({"run": e.run_id, "setting": setting_label(e.record), "shared_setting": setting_label(e.record, framework=False),
                     "workload": c.workload, "framework": c.framework, "strategy": c.strategy,
                     "device": f"{c.device} x{c.world_size}", "batch_size": c.batch_size,
                     "threads": c.threads, "precision": c.spec.precision, "recipe": c.workload_params.get("recipe_label", "–"),
                     "budget": _budget(c.spec), "epochs": s.epochs if s else None, "seed": c.spec.seed,
                     "status": e.status, "older": e.record.version < 2,
                     "time_per_epoch_s": s.time_per_epoch_s if done else nan,
                     "samples_per_s": s.samples_per_s if done else nan,
                     "final_l1": main_loss if main_loss is not None else nan,
                     "time_to_target_s": s.time_to_target_s if done and s.time_to_target_s is not None else nan,
                     "val_horizon_vorticity": _number(s.validation.get("horizon_vorticity")) if done else nan,
                     "test_accuracy": _number(e.record.test.get("accuracy")) if done else nan,
                     "test_f1": _number(e.record.test.get("f1")) if done else nan,
                     "test_longitudinal_err": _number(e.record.test.get("longitudinal_err")) if done else nan,
                     "test_sampling_fraction_err": _number(e.record.test.get("sampling_fraction_err")) if done else nan,
                     "size": _size(c.workload_params),
                     **_utilisation(e.record.utilisation if done else None),
                     **_energy(e.record.energy if done else None),
                     "error": e.error if not done else ""})
    return sorted(rows, key=lambda row: (row["setting"], row["device"], row["batch_size"], str(row["seed"])))


def _size(params: dict) -> str:
    """A swept network's size in words (har: "2 x 32", layers x units); empty for a workload without one."""
    if "network_layers" in params and "network_units" in params:
        return f"{params['network_layers']} x {params['network_units']}"
    return ""


def _utilisation(u) -> dict:
    """A run's achieved TFLOPS and its utilisation, in percent, of the measured ceiling and of the peak (NaN where unknown)."""
    nan = float("nan")
    if u is None:
        return {"achieved_tflops": nan, "mfu_ceiling": nan, "mfu_peak": nan}
    return {"achieved_tflops": u.achieved_tflops, "mfu_ceiling": 100 * u.of_ceiling if u.of_ceiling else nan,
            "mfu_peak": 100 * u.of_peak if u.of_peak else nan}


def ranking_columns(table: list[dict]) -> dict[str, str]:
    """The ranking's columns for one workload's table: the network size only where one is swept, and of the
    test scores (accuracy, macro-F1, the shower metrics) those the workload reports."""
    def shown(key: str) -> bool:
        return any(r[key] not in ("", None) and r[key] == r[key] for r in table)

    # column -> the value whose presence shows it (accuracy's spread goes with accuracy)
    optional = {k: k for k in ("size", "test_accuracy", "test_f1", "test_longitudinal_err", "test_sampling_fraction_err")}
    optional["accuracy_spread"] = "test_accuracy"
    return {k: v for k, v in RANKING_COLUMNS.items() if k not in optional or shown(optional[k])}


def ranking(rows: list[dict]) -> dict[str, list[dict]]:
    """Per workload other than karman (whose quality is the rollouts'), seed 004's table done right: per
    (framework, device, batch size), over its repeated runs, the median time to the quality target with its
    spread (min-max), the runs that reached it, the median test accuracy at the end and its spread, s/epoch,
    samples/s, TFLOPS and utilisation; ranked by median time to target (cells that never reached it last)."""
    import statistics

    nan = float("nan")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "FINISHED" and r["workload"] != "karman":
            groups.setdefault((r["workload"], r["framework"], r["device"], r["batch_size"], r["shared_setting"]), []).append(r)

    def median(members, key):
        values = [m[key] for m in members if m[key] == m[key]]
        return statistics.median(values) if values else nan

    def spread(members, key, scale=1.0, digits=3):
        values = sorted(m[key] * scale for m in members if m[key] == m[key])
        return f"{values[0]:.{digits}g}–{values[-1]:.{digits}g}" if len(values) > 1 else "–"

    out: dict[str, list[dict]] = {}
    for (workload, framework, device, batch, _), members in groups.items():
        reached = [m for m in members if m["time_to_target_s"] == m["time_to_target_s"]]
        out.setdefault(workload, []).append({
            "framework": framework, "size": members[0]["size"], "device": device, "batch_size": batch, "runs": len(members), "reached": len(reached),
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


def comparison(rows: list[dict]) -> dict[str, list[dict]]:
    """Per setting, one row per batch size with each device's median time per epoch and samples/s over
    its runs (seeds), and each device's speedup over the slowest device at that batch size. Nothing is
    compared across settings."""
    import statistics

    out: dict[str, list[dict]] = {}
    for setting in sorted({r["setting"] for r in rows if r["status"] == "FINISHED"}):
        finished = [r for r in rows if r["setting"] == setting and r["status"] == "FINISHED"]
        table = []
        for b in sorted({r["batch_size"] for r in finished}):
            per_device = {}
            for d in sorted({r["device"] for r in finished if r["batch_size"] == b}):
                members = [r for r in finished if r["batch_size"] == b and r["device"] == d]
                per_device[d] = {"time_per_epoch_s": statistics.median(r["time_per_epoch_s"] for r in members),
                                 "samples_per_s": statistics.median(r["samples_per_s"] for r in members), "runs": len(members),
                                 **cell_energy(members)}
            slowest = max(v["time_per_epoch_s"] for v in per_device.values())
            for d, v in per_device.items():
                table.append({"batch_size": b, "device": d, **v,
                              "speedup": slowest / v["time_per_epoch_s"] if len(per_device) > 1 else float("nan")})
        out[setting] = table
    return out


def framework_comparison(rows: list[dict]) -> dict[str, list[dict]]:
    """Cell by cell, the frameworks side by side: per setting apart from the framework, per device and
    batch size that more than one framework ran, each framework's medians over its runs (seeds) of time
    per epoch, samples/s, final L1 and the last validation's vorticity horizon, the spread (min-max) of
    the quality figures over the seeds, and samples/s against torch's in the same cell."""
    import statistics

    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        if r["status"] == "FINISHED":
            groups.setdefault((r["shared_setting"], r["device"], r["batch_size"]), {}).setdefault(r["framework"], []).append(r)
    out: dict[str, list[dict]] = {}

    def spread(values: list[float]) -> str:
        values = sorted(v for v in values if v == v)
        return f"{fmt(values[0])}–{fmt(values[-1])}" if len(values) > 1 else "–"

    for (setting, device, batch), by_framework in sorted(groups.items()):
        if len(by_framework) < 2:
            continue
        cell = []
        for framework, members in sorted(by_framework.items(), key=lambda item: (item[0] != "torch", item[0])):
            median = lambda key: statistics.median(m[key] for m in members)  # noqa: E731
            reached = [m["time_to_target_s"] for m in members if m["time_to_target_s"] == m["time_to_target_s"]]
            cell.append({"device": device, "batch_size": batch, "framework": framework,
                         "strategy": ",".join(sorted({m["strategy"] for m in members})), "runs": len(members),
                         "time_per_epoch_s": median("time_per_epoch_s"), "samples_per_s": median("samples_per_s"),
                         "final_l1": median("final_l1"), "final_l1_spread": spread([m["final_l1"] for m in members]),
                         "val_horizon_vorticity": median("val_horizon_vorticity"),
                         "horizon_spread": spread([m["val_horizon_vorticity"] for m in members]),
                         "time_to_target_s": statistics.median(reached) if reached else float("nan")})
        base = next((c["samples_per_s"] for c in cell if c["framework"] == "torch"), None)
        for c in cell:
            c["vs_torch"] = c["samples_per_s"] / base if base else float("nan")
        out.setdefault(setting, []).extend(cell)
    return out


# A rollout's phase and shape diagnostics and the anchors' metrics (models.rollout_diagnostics), as its record holds them.
DIAGNOSTIC_SCORES = ("horizon_vorticity_lagged", "final_lag_steps", "horizon_vorticity_lowpass", "frequency_rel_error_phase", "correlation_steps",
                     "band_error_low_final", "band_error_mid_final", "band_error_high_final", "acdm_mse_60", "mgn_rmse_1", "mgn_rmse_50", "mgn_rmse_600")


def stride_verdicts(rollouts: list[dict]) -> list[str]:
    """Per device, the smallest frame stride at which a rollout's surrogate was cheaper than the solver per unit of
    simulated time, with the accuracy it held there (its vorticity horizon), or a plain statement that no stride
    measured was, with the strides and the cost ratios measured."""
    lines = []
    for device in sorted({r["device"] for r in rollouts}):
        rows = [r for r in rollouts if r["device"] == device and r["surrogate_vs_solver"] == r["surrogate_vs_solver"]]
        if not rows:
            continue
        cheaper = sorted((r for r in rows if r["surrogate_vs_solver"] >= 1), key=lambda r: (r["stride"], -r["horizon_vorticity"]))
        if cheaper:
            best = cheaper[0]
            lines.append(f"- On {device}, the surrogate is cheaper than the solver from stride k = {best['stride']} on: "
                         f"{best['surrogate_vs_solver']:.2g}x cheaper per unit of simulated time, at vorticity relative L2 within "
                         f"the threshold for {best['horizon_vorticity']} network steps ({best['horizon_vorticity'] * best['stride']} stored "
                         f"frames) of {best['steps']} on {best['setting'][2] or 'the test simulation'} ({best['regime']}).")
        else:
            strides = sorted({r["stride"] for r in rows})
            lo, hi = (f"{x:.2g}" for x in (min(1 / r["surrogate_vs_solver"] for r in rows), max(1 / r["surrogate_vs_solver"] for r in rows)))
            lines.append(f"- On {device}, at no stride measured (k = {', '.join(map(str, strides))}) is the surrogate cheaper than the "
                         f"solver: the solver is {lo if lo == hi else f'{lo}-{hi}'}x faster per unit of simulated time.")
    return lines


def infer_rows(entries: list[Entry]) -> list[dict]:
    """One row per finished rollout: the setting (model, steps, tiling), mode x workers -> frames/s,
    latency split, accuracy, the solver; frames/s against the full-frame rollout of the same setting."""
    rows = []
    nan = float("nan")
    for e in entries:
        if e.status != "FINISHED":
            continue
        c, spec = e.record.config, e.record.config.spec
        m = {k: (nan if v is None else v) for k, v in e.record.summary.scores.items()}
        rows.append({"run": e.run_id, "model_run": c.model_run, "framework": c.framework, "device": spec.device,
                     "mode": spec.mode, "workers": spec.workers, "tiles": c.tiles, "steps": spec.steps,
                     "frames_per_s": m["frames_per_s"], "cold_step_s": m.get("cold_step_s", nan),
                     "compute_s": m.get("latency_compute_s", nan), "split_merge_s": m.get("latency_split_s", nan) + m.get("latency_merge_s", nan),
                     "transfer_s": m.get("latency_transfer_s", nan),
                     "seam_rel_error": m.get("seam_rel_error", nan) if spec.mode == "mapreduce" else None,
                     "final_rel_l2_u": m.get("final_rel_l2_u", nan), "final_rel_l2_vorticity": m.get("final_rel_l2_vorticity", nan),
                     "horizon_u": int(m.get("horizon_u", 0)), "horizon_vorticity": int(m.get("horizon_vorticity", 0)),
                     "regime": c.regime.get("regime", "?"), "strouhal_pred": m.get("strouhal_pred", nan), "strouhal_ref": m.get("strouhal_ref", nan),
                     "solver_frames_per_s": m.get("solver_frames_per_s", nan), "verdict": e.record.summary.verdict,
                     "surrogate_vs_solver": m.get("surrogate_vs_solver", nan), "stride": c.frame_stride,
                     **{k: m.get(k, nan) for k in DIAGNOSTIC_SCORES},
                     "setting": (c.model_run, spec.steps, spec.simulation, str(spec.tile), spec.halo, spec.dataset)})
    for r in rows:  # frames/s over the full-frame rollout on the same device, model and setting
        full = [f["frames_per_s"] for f in rows if f["setting"] == r["setting"] and f["device"] == r["device"] and f["mode"] == "full"]
        r["vs_full"] = r["frames_per_s"] / full[0] if full else nan
    rows.sort(key=lambda row: (row["framework"] != "torch", row["framework"], row["device"], row["mode"], row["workers"]))
    return rows


# Tables narrow enough to read in the Prefect UI: a run's settings and its results side by side would
# run off the right edge, so each is a table of its own, keyed by the run.
TRAIN_SETTINGS_COLUMNS = {"run": "run", "workload": "workload", "framework": "framework", "device": "device", "batch_size": "batch", "threads": "threads", "precision": "precision",
                          "recipe": "recipe", "budget": "budget", "seed": "seed", "status": "status"}
TRAIN_RESULT_COLUMNS = {"run": "run", "epochs": "epochs", "time_per_epoch_s": "s/epoch", "samples_per_s": "samples/s",
                        "final_l1": "final loss", "time_to_target_s": "to target [s]", "achieved_tflops": "TFLOPS",
                        "mfu_ceiling": "% of ceiling", "mfu_peak": "% of peak", "energy": "energy", "device_hours": "device-hours",
                        "cost_text": "cost"}
RANKING_COLUMNS = {"rank": "rank", "framework": "framework", "size": "network (layers x units)", "device": "device", "batch_size": "batch",
                   "runs": "runs", "reached": "reached", "time_to_target_s": "to target [s]", "target_spread": "to target over seeds",
                   "test_accuracy": "test accuracy [%]", "accuracy_spread": "accuracy over seeds", "test_f1": "test macro-F1 [%]",
                   "test_longitudinal_err": "test longitudinal max error [%]", "test_sampling_fraction_err": "test sampling-fraction max error [%]",
                   "time_per_epoch_s": "s/epoch", "samples_per_s": "samples/s",
                   "achieved_tflops": "TFLOPS", "mfu_ceiling": "% of ceiling", "mfu_peak": "% of peak", "energy": "energy", "cost_text": "cost"}
COMPARE_COLUMNS = {"batch_size": "batch", "device": "device", "runs": "runs", "time_per_epoch_s": "s/epoch",
                   "samples_per_s": "samples/s", "speedup": "× slowest device", "energy": "energy", "cost_text": "cost"}
FRAMEWORK_COLUMNS = {"device": "device", "batch_size": "batch", "framework": "framework", "strategy": "strategy", "runs": "runs",
                     "time_per_epoch_s": "s/epoch", "samples_per_s": "samples/s", "vs_torch": "× torch", "final_l1": "final L1",
                     "final_l1_spread": "L1 over seeds", "val_horizon_vorticity": "ω horizon", "horizon_spread": "ω horizon over seeds",
                     "time_to_target_s": "to target [s]"}
QUALITY_COLUMNS = {"framework": "framework", "device": "device", "batch_size": "batch", "recipe": "recipe", "target": "target", "runs": "runs",
                   "reached": "reached", "time_to_target_s": "to target [s]", "fastest_s": "fastest [s]", "slowest_s": "slowest [s]",
                   "not_reached": "not reached", "energy": "energy", "cost_to_target": "cost to target"}
INFER_SPEED_COLUMNS = {"run": "run", "model_run": "model", "framework": "framework", "device": "device", "mode": "mode", "workers": "workers", "tiles": "tiles",
                       "frames_per_s": "frames/s", "vs_full": "× full-frame", "cold_step_s": "cold step [s]", "compute_s": "compute [s]",
                       "split_merge_s": "split+merge [s]", "transfer_s": "transfer [s]"}
INFER_QUALITY_COLUMNS = {"run": "run", "mode": "mode", "workers": "workers", "steps": "steps", "seam_rel_error": "seam error",
                         "horizon_u": "u horizon", "horizon_vorticity": "ω horizon", "strouhal_pred": "St",
                         "strouhal_ref": "St solver", "surrogate_vs_solver": "× solver"}

INFER_DIAGNOSTIC_COLUMNS = {"run": "run", "horizon_vorticity_lagged": "ω horizon, lag-aligned", "final_lag_steps": "final lag [steps]",
                            "horizon_vorticity_lowpass": "ω horizon, low-passed", "frequency_rel_error_phase": "frequency error (phase)",
                            "correlation_steps": "correlation ≥ 0.8 [steps]", "band_error_low_final": "ω error low k",
                            "band_error_mid_final": "mid k", "band_error_high_final": "high k", "acdm_mse_60": "ACDM MSE-60",
                            "mgn_rmse_1": "MGN RMSE-1", "mgn_rmse_50": "RMSE-50", "mgn_rmse_600": "RMSE-600"}


ENERGY_NOTE = ("Energy is the run's devices' over training, from their counters (NVML's total energy of the GPUs; RAPL's CPU "
               "packages, which count every process on the host), or unavailable where none could be read; device-hours are the "
               "training time x the devices (on a CPU, the share of the host's cores the run used), and cost is device-hours at the "
               "price table's price per device-hour (settings: KARMAN_PRICES, KARMAN_CURRENCY).\n")


def covered_runs(settings: Settings, client, exp_id: str, source: str) -> tuple[str, list, list[str]]:
    """(what the report covers, in words; the runs; one line per run it leaves out, saying why): the runs a
    benchmark or demo run recorded in its runs.json ('latest' = the newest such run, or its id); or 'all'
    of the experiment. A recorded run that is deleted since is left out."""
    import json
    import tempfile

    from mlflow.exceptions import MlflowException

    from tasks.common.errors import UserError

    if source == "all":
        runs = [r for stage in ("train", "infer") for r in _rows(client, exp_id, stage)]
        return f"every training and rollout run of experiment `{settings.experiment}`", runs, []
    if source == "latest":
        found = sorted((r for stage in ("benchmark", "demo") for r in client.search_runs(
            [exp_id], f"tags.`{Tag.STAGE}` = '{stage}'", order_by=["attributes.start_time DESC"], max_results=1)),
            key=lambda r: r.info.start_time, reverse=True)
        if not found:
            raise UserError(f"no benchmark or demo run in experiment {settings.experiment!r} to report on; run one, or use --runs all")
        owner = found[0]
    else:
        try:
            owner = client.get_run(source)
        except MlflowException as exc:
            if not missing(exc):
                raise
            raise UserError(f"unknown run {source!r} in the tracking store {settings.tracking_uri}") from None
        if owner.data.tags.get(Tag.STAGE) not in ("benchmark", "demo"):
            raise UserError(f"run {source!r} is not a benchmark or demo run (stage {owner.data.tags.get(Tag.STAGE)!r}); give one, latest or all")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            run_ids = json.loads(Path(client.download_artifacts(owner.info.run_id, "runs.json", tmp)).read_text())["runs"]
        except MlflowException as exc:
            if not missing(exc):
                raise
            raise UserError(f"run {owner.info.run_id} lists no runs (runs.json); it did not get to its cells") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"run {owner.info.run_id} has no readable list of runs (runs.json: {type(exc).__name__}: {exc})") from None
    scope = f"the runs of {owner.data.tags.get(Tag.STAGE)} run {owner.info.run_name} ({owner.info.run_id})"
    runs, left_out = [], []
    for rid in dict.fromkeys(run_ids):
        try:
            run = client.get_run(rid)
        except MlflowException as exc:
            if not missing(exc):
                raise
            left_out.append(f"{rid}: no longer in the tracking store ({exc.error_code})")
            continue
        if run.info.lifecycle_stage == "deleted":
            left_out.append(f"{rid} ({run.info.run_name}): deleted")
            continue
        runs.append(run)
    return scope, runs, left_out


def check_report_source(settings: Settings, spec: AggregateSpec) -> None:
    """UserError, before any run or file is written, when the runs the report should cover cannot be found."""
    from tasks.common.errors import UserError

    client = client_for(settings)
    exp = client.get_experiment_by_name(settings.experiment)
    if exp is None:
        raise UserError(f"experiment {settings.experiment!r} does not exist in the tracking store {settings.tracking_uri}; run a benchmark or the demo first")
    covered_runs(settings, client, exp.experiment_id, spec.runs)


def _embed(markdown: str, folder: Path) -> str:
    """The Markdown with each local figure ![x](name.png) as a data URI, for viewers without the files."""
    import base64

    def inline(match) -> str:
        data = base64.b64encode((folder / match.group(2)).read_bytes()).decode()
        return f"![{match.group(1)}](data:image/png;base64,{data})"

    return re.sub(r"!\[([^\]]*)\]\(([^)/:]+\.png)\)", inline, markdown)


def publish_artifacts(report: dict) -> None:
    """The report that ``aggregate_runs`` returned (figures inline) and its tables as Prefect artifacts of the
    running flow, under keys from the report's name; called once per report, by the flow whose run owns it."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    name = report["name"]
    key = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "report"
    clean = lambda rows: [{k: fmt(v) for k, v in r.items() if k not in ("setting", "shared_setting")} for r in rows]  # noqa: E731
    create_markdown_artifact(markdown=report["markdown"], key=f"{key}-report", description=f"Kármán Bench report {name}")
    create_table_artifact(table=clean(report["train_rows"]) or [{"status": "no training runs"}], key=f"{key}-training",
                          description="Training runs: setting, device, batch size, time per epoch")
    create_table_artifact(table=clean(report["infer_rows"]) or [{"status": "no rollouts"}], key=f"{key}-inference",
                          description="Rollouts: mode x workers -> frames/s, accuracy, solver comparison")


def build_report(settings: Settings, name: str, scope: str, runs, exp_id: str, out: Path,
                 left_out: tuple[str, ...] | list[str] = ()) -> tuple[str, list[Path], dict]:
    """report.md's text and figures (written to ``out``) over ``runs``, with a line for each run of the
    scope it ``left_out`` (and why) or whose record does not read; returns the text, the figures and the tables."""
    client = client_for(settings)
    entries, unread = training_records(client, [r for r in runs if r.data.tags.get(Tag.STAGE) == "train"])
    rolled, unread_rollouts = read_records(client, [r for r in runs if r.data.tags.get(Tag.STAGE) == "infer"], RolloutRecord, "frames_per_s")
    left_out = [*left_out, *unread, *unread_rollouts]
    trains = train_rows(entries)
    quality = quality_table(entries)
    older = [e.run_id[:8] for e in entries + rolled if e.record.version < 2]
    rollouts = infer_rows(rolled)
    failed = [r for r in runs if r.info.status == "FAILED"]
    link = lambda rid: run_link(settings, exp_id, rid)  # noqa: E731
    compared = comparison(trains)
    figures: list[Path] = []
    finished = [r for r in trains if r["status"] == "FINISHED"]
    if finished:
        labels = [f"{r['device']} b{r['batch_size']} s{r['seed']}" + (f" [{i + 1}]" if len(compared) > 1 else "")
                  for r in finished for i in [list(compared).index(r["setting"])]]
        figures.append(bar_chart(labels, [r["samples_per_s"] for r in finished], "samples/s", out / "train_samples_per_s.png",
                                 "training throughput" + (" (settings [1], [2], ... as in the report)" if len(compared) > 1 else "")))
    if rollouts:
        labels = [f"{r['mode']} {r['device']} x{r['workers']}" for r in rollouts]
        figures.append(bar_chart(labels, [r["frames_per_s"] for r in rollouts], "frames/s", out / "infer_frames_per_s.png", "rollout throughput"))
    text = [f"# Kármán Bench report `{name}`\n",
            f"Covers {scope}: {len(trains)} training and {len(rollouts)} rollout runs. Experiment `{settings.experiment}` at "
            f"`{settings.tracking_uri}`, written {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}. "
            "Rows are compared only within one setting (framework, precision, recipe, widths, budget, threads, dataset); "
            "a speedup is one device over the slowest device at the same batch size and setting.\n",
            "## Training: device × batch size\n"]
    for i, (setting, table) in enumerate(compared.items(), 1):
        text += [f"**Setting [{i}]**: {setting}\n", table_markdown(table, COMPARE_COLUMNS)]
    if not compared:
        text.append("_no finished training runs_\n")
    frameworks = framework_comparison([r for r in trains if r["workload"] == "karman"])  # the others: their ranking below
    if frameworks:
        text += ["## Frameworks side by side\n",
                 "The same networks, recipe, data, split, seeds and budget in each framework, cell by cell (device and batch size); "
                 "× torch is samples/s over torch's in the same cell. Quality after equal epochs: final L1 is the last epoch's mean "
                 "training loss, ω horizon the steps the last validation rollout kept vorticity within the target; "
                 "their spread is the range over the seeds.\n"]
        for setting, table in frameworks.items():
            text += [f"**Setting**: {setting}\n", table_markdown(table, FRAMEWORK_COLUMNS)]
    ranked = ranking(trains)
    for workload, table in ranked.items():
        text += [f"## {_workload_words(workload, 'title')}: frameworks and devices ranked by time to target\n",
                 f"Data: {_workload_words(workload, 'data')}. Target: {_workload_words(workload, 'target')}, judged on the validation split "
                 "after each validation; the test scores (accuracy, macro-F1, or the shower metrics' largest relative errors) are the "
                 "held-out test split's after the last epoch. Medians over the repeated runs "
                 "(seeds), with their range; TFLOPS are the network's training FLOPs at the run's samples/s, % of ceiling against the "
                 "warm matmul ceiling of the same device, framework and dtype, % of peak against the device's datasheet (CPU: derived) peak.\n",
                 table_markdown(table, ranking_columns(table))]
    text += ["### Every training run\n", "s/epoch is the median epoch time without the first epoch (which carries the warm-up).\n",
             table_markdown(trains, TRAIN_SETTINGS_COLUMNS, link), "Their results:\n", table_markdown(trains, TRAIN_RESULT_COLUMNS, link),
             ENERGY_NOTE + energy_notes(trains),
             "## Time to quality\n", "Wall-clock seconds of training until the validation rollouts first meet the run's quality "
             "target (the mean over repeated runs, without the fastest and slowest when three or more reached it); energy and cost "
             "to target are medians over the runs:\n",
             table_markdown(quality, QUALITY_COLUMNS), cheapest_to_target(entries, link),
             "## Inference: rollout speed and accuracy against the solver\n",
             "× full-frame: frames/s over the full-frame rollout of the same model, device and steps; seam error applies to map-reduce only.\n",
             table_markdown(rollouts, INFER_SPEED_COLUMNS, link), "Accuracy against the solver:\n",
             table_markdown(rollouts, INFER_QUALITY_COLUMNS, link),
             "Phase against shape, and the published surrogates' measures: the lag-aligned horizon counts the steps whose vorticity "
             "is within the threshold of some reference frame within half a shedding period (the final lag: the shift that fits the "
             "last step, positive ahead); the low-passed one, after a Gaussian of 1.5 cells on both fields; the frequency error comes "
             "from the phase of v at three wake probes (signed: positive sheds too fast); the band errors are the last step's vorticity "
             "error per wavenumber band on the Hann-windowed wake (The Well's bins); ACDM MSE-60 is over 60 steps on fields normalised "
             "by their deviation (Kohl et al. 2023), MGN RMSE of velocity in units of the mean inflow (Pfaff et al. 2021), the "
             "correlation steps PDE-Refiner's high-correlation time (Lippe et al. 2023).\n",
             table_markdown(rollouts, INFER_DIAGNOSTIC_COLUMNS, link),
             "## Is the surrogate worth it?\n",
             "\n".join(stride_verdicts(rollouts)) + "\n" if rollouts else "",
             "\n".join(f"- {link(r['run'])} ({r['mode']} x{r['workers']}, {r['regime']}): {r['verdict']}" for r in rollouts if r["verdict"])
             or "_no rollout with a verdict_", "",
             f"## Failed runs\n\n{len(failed)} failed run(s)" + (": " + ", ".join(f"{r.info.run_name} ({link(r.info.run_id)})" for r in failed) if failed else "") + "\n"]
    text.append(ceiling_section(client, exp_id))
    if older:
        text.append(f"Runs logged before run records existed, read back from their MLflow params: {', '.join(older)}.\n")
    if left_out:
        text.append(f"## Runs left out\n\n{len(left_out)} recorded run(s) not reported:\n" + "".join(f"\n- {line}" for line in left_out) + "\n")
    text += [f"![{f.stem}]({f.name})\n" for f in figures]
    return "\n".join(text), figures, {"train_rows": trains, "infer_rows": rollouts, "quality_rows": quality,
                                      "ranking_rows": [row | {"workload": w} for w, table in ranked.items() for row in table],
                                      "framework_rows": [row for table in frameworks.values() for row in table]}


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
    embedded = _embed(text, out)
    with mlflow_run(settings, "aggregate", f"aggregate-{spec.name}", params=spec.model_dump(), parent_run_id=parent_run_id,
                    description=f"Report `{spec.name}` over {scope}.") as run:
        run.log_metrics({"train_runs": len(tables["train_rows"]), "infer_runs": len(tables["infer_rows"])})
        for path in [report, html_report, *figures]:
            run.log_artifact(path, "report")
    logger.info("report over %s: %d training and %d rollout rows, written to %s", scope, len(tables["train_rows"]),
                len(tables["infer_rows"]), report)
    return {"name": spec.name, "report": str(report), "html": str(html_report), "markdown": embedded, "figures": [str(f) for f in figures],
            "run_id": run.run_id, "scope": scope, **tables}
