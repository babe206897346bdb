"""karman's own parts of the report, and the rows and text of its recipe ablation.

Its frameworks side by side, its rollouts against the solver and whether the surrogate is worth it (``sections``, the
workload's ``report``), and the rows and text of its training recipe ablation."""

import statistics
from pathlib import Path
from typing import Callable

from tasks.common.reports.plots import bar_chart
from tasks.common.reports.reporting import Sections, fmt, table_markdown
from tasks.common.reports.tables import markdown_table
from tasks.common.config.frameworks import DEFAULT, order

ABLATION_COLUMNS = ("one_step_rel_l2_u", "one_step_rel_l2_vorticity", "one_step_skill_u", "one_step_skill_vorticity", "horizon_u", "horizon_vorticity",
                    "strouhal_rel_error", "correlation_periods", "energy_ratio_final", "horizon_vorticity_lagged", "frequency_rel_error_phase")

# The long rollouts' scores an ablation row keeps: the worst over the extra simulations, each by its own sense of worse.
LONG_COLUMNS = {"horizon_u": min, "horizon_vorticity": min, "horizon_vorticity_lagged": min, "horizon_vorticity_lowpass": min,
                "correlation_periods": min,
                "energy_ratio_max_deviation": max, "shedding_amplitude_ratio": lambda values: max(values, key=lambda a: abs(a - 1)),
                "frequency_rel_error_phase": lambda values: max(values, key=abs)}

# A rollout's phase and shape diagnostics and the anchors' metrics (models.karman.rollout_diagnostics), as its record holds them.
DIAGNOSTIC_SCORES = ("horizon_vorticity_lagged", "final_lag_steps", "horizon_vorticity_lowpass", "frequency_rel_error_phase", "correlation_steps",
                     "band_error_low_final", "band_error_mid_final", "band_error_high_final", "acdm_mse_60", "mgn_rmse_1", "mgn_rmse_50", "mgn_rmse_600")

FRAMEWORK_COLUMNS = {"device": "device", "batch_size": "batch", "framework": "framework", "strategy": "strategy", "runs": "runs",
                     "time_per_epoch_s": "s/epoch", "samples_per_s": "samples/s", "vs_torch": "× torch", "final_l1": "final L1",
                     "final_l1_spread": "L1 over seeds", "val_horizon_vorticity": "ω horizon", "horizon_spread": "ω horizon over seeds",
                     "time_to_target_s": "to target [s]"}
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


def sections(trains: list[dict], rollouts: list, link: Callable[[str], str], out: Path) -> Sections:
    """karman's parts of the report over its training rows (the report's train_rows) and its rollout runs (entries
    with run_id, status and a RolloutRecord): its frameworks side by side, its rollouts' speed and accuracy against
    the solver, whether the surrogate is worth it, and the rollout throughput figure (written to ``out``)."""
    frameworks = framework_comparison(trains)
    training = []
    if frameworks:
        training += ["## Frameworks side by side\n",
                     "The same networks, recipe, data, split, seeds and budget in each framework, cell by cell (device and batch size); "
                     "× torch is samples/s over torch's in the same cell. Quality after equal epochs: final L1 is the last epoch's mean "
                     "training loss, ω horizon the steps the last validation rollout kept vorticity within the target; "
                     "their spread is the range over the seeds.\n"]
        for setting, table in frameworks.items():
            training += [f"**Setting**: {setting}\n", table_markdown(table, FRAMEWORK_COLUMNS)]
    rows = infer_rows(rollouts)
    figures = []
    if rows:
        labels = [f"{r['mode']} {r['device']} x{r['workers']}" for r in rows]
        figures.append(bar_chart(labels, [r["frames_per_s"] for r in rows], "frames/s", out / "infer_frames_per_s.png", "rollout throughput"))
    return Sections(training=training, rollouts=rollout_sections(rows, link), figures=figures, rollout_rows=rows,
                    tables={"framework_rows": [row for table in frameworks.values() for row in table]})


def rollout_sections(rows: list[dict], link: Callable[[str], str]) -> list[str]:
    """The rollouts' speed, accuracy against the solver and diagnostics, and whether the surrogate is worth it."""
    return ["## Inference: rollout speed and accuracy against the solver\n",
            "× full-frame: frames/s over the full-frame rollout of the same model, device and steps; seam error applies to map-reduce only.\n",
            table_markdown(rows, INFER_SPEED_COLUMNS, link), "Accuracy against the solver:\n",
            table_markdown(rows, INFER_QUALITY_COLUMNS, link),
            "Phase against shape, and the published surrogates' measures: the lag-aligned horizon counts the steps whose vorticity "
            "is within the threshold of some reference frame within half a shedding period (the final lag: the shift that fits the "
            "last step, positive ahead); the low-passed one, after a Gaussian of 1.5 cells on both fields; the frequency error comes "
            "from the phase of v at three wake probes (signed: positive sheds too fast); the band errors are the last step's vorticity "
            "error per wavenumber band on the Hann-windowed wake (The Well's bins); ACDM MSE-60 is over 60 steps on fields normalised "
            "by their deviation (Kohl et al. 2023), MGN RMSE of velocity in units of the mean inflow (Pfaff et al. 2021), the "
            "correlation steps PDE-Refiner's high-correlation time (Lippe et al. 2023).\n",
            table_markdown(rows, INFER_DIAGNOSTIC_COLUMNS, link),
            "## Is the surrogate worth it?\n",
            "\n".join(stride_verdicts(rows)) + "\n" if rows else "",
            "\n".join(f"- {link(r['run'])} ({r['mode']} x{r['workers']}, {r['regime']}): {r['verdict']}" for r in rows if r["verdict"])
            or "_no rollout with a verdict_", ""]


def framework_comparison(rows: list[dict]) -> dict[str, list[dict]]:
    """Cell by cell, the frameworks side by side: per setting apart from the framework, per device and
    batch size that more than one framework ran, each framework's medians over its runs (seeds) of time
    per epoch, samples/s, final L1 and the last validation's vorticity horizon, the spread (min-max) of
    the quality figures over the seeds, and samples/s against torch's in the same cell."""
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
        for framework, members in sorted(by_framework.items(), key=lambda item: order(item[0])):
            median = lambda key: statistics.median(m[key] for m in members)  # noqa: E731
            reached = [m["time_to_target_s"] for m in members if m["time_to_target_s"] == m["time_to_target_s"]]
            cell.append({"device": device, "batch_size": batch, "framework": framework,
                         "strategy": ",".join(sorted({m["strategy"] for m in members})), "runs": len(members),
                         "time_per_epoch_s": median("time_per_epoch_s"), "samples_per_s": median("samples_per_s"),
                         "final_l1": median("final_l1"), "final_l1_spread": spread([m["final_l1"] for m in members]),
                         "val_horizon_vorticity": median("val_horizon_vorticity"),
                         "horizon_spread": spread([m["val_horizon_vorticity"] for m in members]),
                         "time_to_target_s": statistics.median(reached) if reached else float("nan")})
        base = next((c["samples_per_s"] for c in cell if c["framework"] == DEFAULT), None)  # the default framework (torch) is the base
        for c in cell:
            c["vs_torch"] = c["samples_per_s"] / base if base else float("nan")
        out.setdefault(setting, []).extend(cell)
    return out


def infer_rows(entries: list) -> list[dict]:
    """One row per finished rollout (entries with run_id, status and a RolloutRecord): the setting (model, steps,
    tiling), mode x workers -> frames/s, latency split, accuracy, the solver; frames/s against the full-frame
    rollout of the same setting."""
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
    rows.sort(key=lambda row: (order(row["framework"]), row["device"], row["mode"], row["workers"]))
    return rows


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
    out = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        done = [r for r in rows if r["variant"] == variant and r["train_run"] != "FAILED"]
        row = {"variant": variant, "runs": len(done)}
        for key in (k for k in rows[0] if k not in ("variant", "seed", "train_run")):
            values = [r[key] for r in done if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
            row[key] = float(statistics.median(values)) if values else float("nan")
        out.append(row)
    return out


def ablation_markdown(name: str, params: dict, rows: list[dict], simulation: str, extra: list[str] = ()) -> str:
    """ablation.md's text: the variants' rows (the ``long_`` columns where there were ``extra`` rollouts, on those
    simulations) and, over more than one seed, their medians; ``params`` is the ablation's spec as a dictionary."""
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
    return text


def ablation_table(name: str, params: dict, results: list[tuple], simulation: str, extra: list[str] = ()) -> tuple[list[dict], str]:
    """The recipe ablation's rows and its Markdown (the ablate flow's report): ``results`` holds (variant, seed, training
    result, rollout on the test simulation, rollouts on the extra simulations) for each trained variant and seed."""
    rows = [ablation_row(*result) for result in results]
    return rows, ablation_markdown(name, params, rows, simulation, extra)

