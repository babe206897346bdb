"""The report's training tables: one row per run, devices compared within a setting, time to the quality target."""

import math
import statistics

from tasks.report.capabilities import budget, learned_nothing, setting_label, target_words
from tasks.report.energy import cell_energy, money, run_energy
from tasks.report.intervals import Interval
from tasks.report.ranking import rules_of
from tasks.report.reading import Entry

# Tables narrow enough to read in the Prefect UI: a run's settings and its results side by side would
# run off the right edge, so each is a table of its own, keyed by the run.
TRAIN_SETTINGS_COLUMNS = {"run": "run", "workload": "workload", "framework": "framework", "device": "device", "batch_size": "batch", "threads": "threads", "precision": "precision",
                          "recipe": "recipe", "budget": "budget", "seed": "seed", "status": "status"}
TRAIN_RESULT_COLUMNS = {"run": "run", "epochs": "epochs", "time_per_epoch_s": "s/epoch", "samples_per_s": "samples/s",
                        "final_l1": "final loss", "time_to_target_s": "to target [s]", "achieved_tflops": "TFLOPS",
                        "mfu_ceiling": "% of ceiling", "mfu_peak": "% of peak", "energy": "energy", "device_hours": "device-hours",
                        "cost_text": "cost"}
COMPARE_COLUMNS = {"batch_size": "batch", "device": "device", "runs": "runs", "time_per_epoch_s": "s/epoch",
                   "samples_per_s_ci": "samples/s", "speedup": "× slowest device", "energy": "energy", "cost_text": "cost"}
QUALITY_COLUMNS = {"framework": "framework", "device": "device", "batch_size": "batch", "recipe": "recipe", "target": "target", "runs": "runs",
                   "reached": "reached", "result": "result (run rules)", "time_to_target_s": "to target [s]", "median_ci": "median to target [s]", "fastest_s": "fastest [s]", "slowest_s": "slowest [s]",
                   "not_reached": "not reached", "energy": "energy", "cost_to_target": "cost to target"}


def train_rows(entries: list[Entry]) -> list[dict]:
    """One row per training run (finished or failed) with the settings that define it."""
    rows = []
    nan = float("nan")
    for e in entries:
        c, s = e.record.config, e.record.summary
        done = e.status == "FINISHED"
        timed = done and s.time_to_target_s is not None and not s.resumes  # a resumed run's time to target is no time-to-train
        main_loss = s.final_losses.get("loss_l1", next(iter(s.final_losses.values()), None)) if done else None
        rows.append({"run": e.run_id, "setting": setting_label(e.record), "shared_setting": setting_label(e.record, framework=False),
                     "workload": c.workload, "framework": c.framework, "strategy": c.strategy,
                     "device": f"{c.device} x{c.world_size}", "batch_size": c.batch_size,
                     "threads": c.threads, "precision": c.spec.precision, "recipe": c.workload_params.get("recipe_label", "–"),
                     "budget": budget(c.spec), "epochs": s.epochs if s else None, "seed": c.spec.seed,
                     "status": e.status, "older": e.record.version < 2,
                     "time_per_epoch_s": s.time_per_epoch_s if done else nan,
                     "samples_per_s": s.samples_per_s if done else nan,
                     "final_l1": main_loss if main_loss is not None else nan,
                     "time_to_target_s": s.time_to_target_s if timed else nan,
                     "cost_to_target": e.record.energy.cost_of(s.time_to_target_s) if timed and e.record.energy is not None else nan,
                     # the run's energy at its mean power over training, until the target (its scope: energy_scope)
                     "energy_to_target_j": (e.record.energy.joules * s.time_to_target_s / s.train_time_s
                                            if timed and e.record.energy is not None and e.record.energy.joules is not None and s.train_time_s else nan),
                     "resumes": s.resumes if done else 0,
                     # what the convergence check reads (tasks.report.convergence)
                     "epochs_to_target": s.epochs_to_target if done else None, "validate_every": c.spec.validate_every if done else None,
                     "target": target_words(e.record),
                     "val_horizon_vorticity": _number(s.validation.get("horizon_vorticity")) if done else nan,
                     "test_accuracy": _number(e.record.test.get("accuracy")) if done else nan,
                     "test_f1": _number(e.record.test.get("f1")) if done else nan,
                     "test_longitudinal_err": _number(e.record.test.get("longitudinal_err")) if done else nan,
                     "test_sampling_fraction_err": _number(e.record.test.get("sampling_fraction_err")) if done else nan,
                     "size": _size(c.workload_params),
                     **_utilisation(e.record.utilisation if done else None),
                     **run_energy(e.record.energy if done else None),
                     "learned_nothing": learned_nothing(e.record) if done else "",
                     "error": e.error if not done else ""})
    return sorted(rows, key=lambda row: (row["setting"], row["device"], row["batch_size"], str(row["seed"])))


def _number(value: float | None) -> float:
    return float("nan") if value is None else value


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


def comparison(rows: list[dict]) -> dict[str, list[dict]]:
    """Per setting, one row per batch size with each device's median time per epoch and samples/s over
    its runs (seeds), and each device's speedup over the slowest device at that batch size. Nothing is
    compared across settings."""
    out: dict[str, list[dict]] = {}
    for setting in sorted({r["setting"] for r in rows if r["status"] == "FINISHED"}):
        finished = [r for r in rows if r["setting"] == setting and r["status"] == "FINISHED"]
        table = []
        for b in sorted({r["batch_size"] for r in finished}):
            per_device = {}
            for d in sorted({r["device"] for r in finished if r["batch_size"] == b}):
                members = [r for r in finished if r["batch_size"] == b and r["device"] == d]
                samples = Interval.of(r["samples_per_s"] for r in members)
                per_device[d] = {"time_per_epoch_s": statistics.median(r["time_per_epoch_s"] for r in members),
                                 "samples_per_s": samples.median, "samples_per_s_ci": samples.text(), "runs": len(members),
                                 **cell_energy(members)}
            slowest = max(v["time_per_epoch_s"] for v in per_device.values())
            for d, v in per_device.items():
                table.append({"batch_size": b, "device": d, **v,
                              "speedup": slowest / v["time_per_epoch_s"] if len(per_device) > 1 else float("nan")})
        out[setting] = table
    return out


def quality_table(entries: list[Entry]) -> list[dict]:
    """Time to the quality target per configuration (workload, framework, device, batch size, setting, target),
    MLPerf-style over its repeated runs (seeds): the mean time-to-target with the fastest and slowest
    dropped when at least three runs reached it, their spread, and how many runs never reached it; and the median with its
    95 % interval and n, a run that missed counted as the slowest (as the ranking counts it)."""
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
        rules = rules_of(members[0].record.config.workload)
        # a resumed run's clock stopped; a run past the workload's max_runtime did not reach the target in time
        timed = [m for m in members if m.record.summary.target_reached and not m.record.summary.resumes and rules.reached(m.record.summary.time_to_target_s)]
        times = sorted(m.record.summary.time_to_target_s for m in timed)
        kept = times[1:-1] if len(times) >= 3 else times
        missed = [m.run_id[:8] + (" (resumed)" if m.record.summary.resumes else "") for m in members if m not in timed]
        rows.append({"framework": framework, "device": f"{device} x{world}", "batch_size": batch, "recipe": recipe, "target": target,
                     "runs": len(members), "reached": len(times), "result": rules.verdict(len(members), len(times)),
                     "time_to_target_s": sum(kept) / len(kept) if kept else nan,
                     "median_ci": Interval.of([m.record.summary.time_to_target_s if m in timed else math.inf for m in members]).text(),
                     "fastest_s": times[0] if times else nan, "slowest_s": times[-1] if times else nan,
                     "time_per_epoch_s": sorted(m.record.summary.time_per_epoch_s for m in members)[len(members) // 2],
                     "not_reached": ", ".join(missed) or "-",
                     **cell_energy([run_energy(m.record.energy) for m in members]),
                     "cost_to_target": money([(m.record.energy.cost_of(m.record.summary.time_to_target_s), m.record.energy.currency)
                                               for m in timed if m.record.energy is not None])})
    return rows
