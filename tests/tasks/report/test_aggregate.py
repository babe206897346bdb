"""The report's time-to-quality table over real MLflow runs (a local store)."""

import math

import pytest
from mlflow.tracking import MlflowClient

from tasks.report.reading import training_records
from tasks.report.tables import quality_table


def _run(client, exp, batch: int, seed: int, reached: bool, time_to_target: float, status: str = "FINISHED"):
    run = client.create_run(exp, tags={"karman.stage": "train"})
    rid = run.info.run_id
    for k, v in {"framework": "torch", "device": "cpu", "world_size": 1, "batch_size": batch, "seed": seed,
                 "recipe_label": "default", "target_vorticity": 0.3, "target_steps": 40}.items():
        client.log_param(rid, k, v)
    client.log_metric(rid, "train_time_s", 300.0)
    client.log_metric(rid, "time_per_epoch_s", 5.0 + seed)
    client.log_metric(rid, "target_reached", float(reached))
    if reached:
        client.log_metric(rid, "time_to_target_s", time_to_target)
    client.set_terminated(rid, status)
    return rid


def _records(client, exp):
    """The entries of the experiment's training runs as the report reads them (these runs, logged as the
    version before run records logged them, are read back from their params)."""
    entries, left_out = training_records(client, client.search_runs([exp], "tags.`karman.stage` = 'train'"))
    assert left_out == [] and all(e.record.version == 1 for e in entries)
    return entries


def test_time_to_quality_drops_the_fastest_and_slowest_and_lists_runs_that_missed(workdir):
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'q.db'}")
    exp = client.create_experiment("q", artifact_location=str(workdir / "art"))
    for seed, t in enumerate([100.0, 40.0, 70.0, 160.0]):
        _run(client, exp, 8, seed, True, t)
    missed = _run(client, exp, 8, 4, False, 0.0)
    _run(client, exp, 8, 5, True, 1.0, status="FAILED")  # a failed run is no evidence either way
    _run(client, exp, 16, 0, True, 50.0)
    _run(client, exp, 16, 1, True, 30.0)
    rows = quality_table(_records(client, exp))
    b8, b16 = rows
    assert (b8["batch_size"], b8["runs"], b8["reached"]) == (8, 5, 4)
    assert b8["time_to_target_s"] == (70.0 + 100.0) / 2  # 40 and 160 dropped
    assert (b8["fastest_s"], b8["slowest_s"]) == (40.0, 160.0)
    assert b8["not_reached"] == missed[:8]
    assert b8["target"] == "vorticity <= 0.3 for 40 steps" and b8["device"] == "cpu x1"
    assert (b16["runs"], b16["reached"], b16["time_to_target_s"], b16["not_reached"]) == (2, 2, 40.0, "-")  # two: no drop


def test_a_configuration_that_never_reached_the_target_has_no_time(workdir):
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'q.db'}")
    exp = client.create_experiment("q", artifact_location=str(workdir / "art"))
    _run(client, exp, 8, 0, False, 0.0)
    (row,) = quality_table(_records(client, exp))
    assert row["reached"] == 0 and math.isnan(row["time_to_target_s"]) and row["not_reached"] != "-"


def _timed_run(client, exp, device: str, batch: int, threads: int, epochs: int, time_per_epoch: float, seed: int = 0):
    run = client.create_run(exp, tags={"karman.stage": "train"})
    rid = run.info.run_id
    for k, v in {"framework": "torch", "device": device, "world_size": 1, "batch_size": batch, "seed": seed, "epochs": epochs,
                 "time_budget": None, "max_steps": None, "crop": None, "precision": "fp32", "recipe_label": "default",
                 "recipe_ngf": 16, "dataset_digest": "abcdef0123456789", "device_name": f"{device} ({threads} threads)"}.items():
        client.log_param(rid, k, v)
    for k, v in {"time_per_epoch_s": time_per_epoch, "samples_per_s": 400 / time_per_epoch, "epochs": epochs}.items():
        client.log_metric(rid, k, v)
    client.set_terminated(rid, "FINISHED")
    return rid


def test_rows_are_compared_only_within_one_setting(workdir):
    """The demo's batch-8 run (10 epochs, 1 thread) and a benchmark's (3 epochs, 2 threads) are two
    settings: never one table, never a speedup between them; devices within a setting are compared
    at the same batch size over the median of their seeds."""
    from tasks.common.reports.reporting import fmt, table_markdown
    from tasks.report.tables import comparison, train_rows

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'q.db'}")
    exp = client.create_experiment("q", artifact_location=str(workdir / "art"))
    _timed_run(client, exp, "cpu", 8, 1, 10, 40.0)
    _timed_run(client, exp, "cpu", 8, 2, 3, 10.0)
    _timed_run(client, exp, "cpu", 4, 2, 3, 12.0)
    for seed, t in enumerate((2.0, 3.0, 100.0)):  # the median of three seeds, not their mean
        _timed_run(client, exp, "cuda", 8, 2, 3, t, seed)
    rows = train_rows(_records(client, exp))
    assert {(r["threads"], r["budget"], r["epochs"]) for r in rows} == {(1, "10 epochs", 10), (2, "3 epochs", 3)}
    tables = comparison(rows)
    assert len(tables) == 2
    one_thread = next(t for s, t in tables.items() if "1 CPU thread," in s)
    assert [(r["batch_size"], r["device"]) for r in one_thread] == [(8, "cpu x1")] and math.isnan(one_thread[0]["speedup"])
    two = {(r["batch_size"], r["device"]): r for r in next(t for s, t in tables.items() if "2 CPU threads" in s)}
    assert two[(8, "cuda x1")]["time_per_epoch_s"] == 3.0 and two[(8, "cuda x1")]["runs"] == 3
    assert two[(8, "cuda x1")]["speedup"] == 10.0 / 3.0 and two[(8, "cpu x1")]["speedup"] == 1.0
    assert math.isnan(two[(4, "cpu x1")]["speedup"])  # batch 4 against batch 8 is no speedup
    assert [fmt(v) for v in (7.969613040500008, 0.012345, 1234.5, 12, float("nan"), None)] == ["7.97", "0.0123", "1,234", "12", "–", "–"]
    text = table_markdown(rows, {"run": "run", "threads": "threads"}, links=lambda rid: f"<{rid[:4]}>")
    assert text.count("<") == len(rows) and "| threads |" in text


def test_a_runs_samples_per_s_is_its_epochs_samples_over_its_s_per_epoch(workdir):
    """Runs logged before each epoch's value moved to epoch_samples_per_s hold it under samples_per_s
    too (MLflow shows the last one): the table takes an epoch's samples over the median epoch time, so
    its two columns agree for old and new runs alike."""
    from tasks.report.tables import train_rows

    client = MlflowClient()
    exp = client.create_experiment("samples")
    rid = _timed_run(client, exp, "cpu", 8, 2, 3, 8.0)
    client.log_param(rid, "train_pairs", 427)
    client.log_metric(rid, "samples_per_s", 30.0, step=3)  # the last epoch's, slower than the median epoch
    (row,) = train_rows(training_records(client, [client.get_run(rid)])[0])
    assert row["samples_per_s"] == pytest.approx(424 / 8.0)


def test_a_recorded_run_deleted_since_is_left_out_and_the_report_says_which_and_why(workdir):
    import json

    from tasks.common.config.settings import Settings
    from tasks.common.tracking.runs import client_for, experiment_id
    from tasks.report.reading import covered_runs
    from tasks.report.render import build_report

    settings = Settings.from_env()
    client = client_for(settings)
    exp = experiment_id(client, settings)
    kept, deleted = _run(client, exp, 8, 0, True, 50.0), _run(client, exp, 8, 1, True, 60.0)
    client.delete_run(deleted)
    gone = "f" * 32  # never in the store (or removed for good)
    demo = client.create_run(exp, tags={"karman.stage": "demo"}).info.run_id
    (workdir / "runs.json").write_text(json.dumps({"runs": [kept, deleted, gone]}))
    client.log_artifact(demo, str(workdir / "runs.json"))
    client.set_terminated(demo, "FINISHED")

    scope, runs, left_out = covered_runs(settings, client, exp, "latest")
    assert demo in scope and [r.info.run_id for r in runs] == [kept]
    assert len(left_out) == 2 and left_out[0].startswith(f"{deleted} (") and left_out[0].endswith("): deleted")
    assert left_out[1] == f"{gone}: no longer in the tracking store (RESOURCE_DOES_NOT_EXIST)"
    text, _, _ = build_report(settings, "r", scope, runs, exp, workdir, left_out)
    section = text.split("## Runs left out\n", 1)[1]
    assert section.startswith("\n2 recorded run(s) not reported:") and f"\n- {left_out[0]}\n" in section and f"\n- {left_out[1]}\n" in section


def test_a_rollout_logged_before_records_reads_back_into_its_row(workdir):
    """A rollout of the version before run records (params, metrics and tags only) becomes a typed record and a
    report row, and is marked as older."""
    from tasks.common.records import RolloutRecord
    from tasks.report.reading import read_records
    from tasks.workloads.karman.report import infer_rows

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'q.db'}")
    exp = client.create_experiment("q", artifact_location=str(workdir / "art"))
    rid = client.create_run(exp, tags={"karman.stage": "infer", "karman.model_run": "ab" * 16, "karman.framework": "tensorflow"}).info.run_id
    for k, v in {"model_run": "latest", "device": "cpu", "mode": "mapreduce", "workers": 2, "tile": None, "halo": 8, "steps": 40,
                 "dataset": None, "simulation": None, "rollout_simulation": "circle-re95", "rollout_steps": 40, "frame_stride": 1,
                 "tile_shape": "64x80", "tiles": 2, "regime": "interpolation", "reynolds": 95.0, "verdict": "slower than the solver",
                 "solver_compared": "numba on 2 threads"}.items():
        client.log_param(rid, k, v)
    for k, v in {"frames_per_s": 20.0, "seam_rel_error": 0.02, "horizon_vorticity": 31, "strouhal_pred": 0.32}.items():
        client.log_metric(rid, k, v)
    client.set_terminated(rid, "FINISHED")
    entries, left_out = read_records(client, client.search_runs([exp]), RolloutRecord, "frames_per_s")
    assert left_out == [] and [e.record.version for e in entries] == [1]
    config = entries[0].record.config
    assert (config.framework, config.simulation, config.tile, config.tiles, config.spec.workers) == ("tensorflow", "circle-re95", (64, 80), 2, 2)
    (row,) = infer_rows(entries)
    assert (row["mode"], row["workers"], row["frames_per_s"], row["horizon_vorticity"], row["regime"]) == ("mapreduce", 2, 20.0, 31, "interpolation")
    assert row["verdict"] == "slower than the solver" and row["seam_rel_error"] == 0.02


def _priced(device: str, world: int, reached: float | None, price: float, joules: float | None, run_id: str, samples: int | None = 7):
    """A finished run's entry (read back as the report reads it) with its energy (the counter its device has: NVML on cuda, RAPL
    on cpu, ``samples`` readings) and price."""
    from tasks.common.records import Energy, TrainRecord
    from tasks.report.reading import Entry

    metrics = {"time_per_epoch_s": 5.0, "train_time_s": 600.0, "target_reached": float(reached is not None),
               **({"time_to_target_s": reached} if reached is not None else {})}
    record = TrainRecord.from_mlflow({"device": device, "world_size": str(world), "batch_size": "8", "framework": "torch"}, metrics, True)
    source = "nvml: total energy of GPU(s) 0" if device == "cuda" else "rapl: package-0 (whole CPU packages: every process on the host counts)"
    energy = Energy(joules=joules, source=source if joules is not None else "unavailable: no /sys/class/powercap on this host", samples=samples,
                    devices=float(world), device_hours=world * 600.0 / 3600, price_per_device_hour=price, currency="EUR")
    return Entry(run_id, "train", "FINISHED", "", record.model_copy(update={"energy": energy}))


def test_energy_cost_and_the_cheapest_device_to_the_target_are_shown_or_said_to_be_missing():
    from tasks.common.reports.reporting import table_markdown
    from tasks.report.energy import cheapest_to_target, energy_notes
    from tasks.report.tables import TRAIN_RESULT_COLUMNS, quality_table, train_rows

    cpu = _priced("cpu", 1, 720.0, 0.10, None, "c" * 32)       # 0.10 x 1 x 0.2 h = 0.02
    gpu = _priced("cuda", 2, 36.0, 3.00, 5000.0, "g" * 32)     # 3.00 x 2 x 0.01 h = 0.06
    slow = _priced("cuda", 1, None, 3.00, 9000.0, "s" * 32)     # never reached: not a candidate
    line = cheapest_to_target([cpu, gpu, slow])
    assert "**cpu x1** (torch, batch 8, run cccccccc) for 0.02 EUR: 0.1 EUR per device-hour x 1 device(s) x 720 s to the target" in line
    rows = train_rows([cpu, gpu])
    table = table_markdown(rows, TRAIN_RESULT_COLUMNS)
    assert "| 5000 J (GPU board, 7 readings) | 0.333 | 1 EUR |" in table and "| not measured | 0.167 | 0.0167 EUR |" in table
    assert energy_notes(rows) == "Energy not measured for cccccccc: no /sys/class/powercap on this host.\n"
    by_device = {r["device"]: r for r in quality_table([cpu, gpu])}
    assert (by_device["cuda x2"]["energy"], by_device["cuda x2"]["cost_to_target"]) == ("GPU board: 5000 J (1 run: no interval), 7 readings", "0.06 EUR")
    assert (by_device["cpu x1"]["energy"], by_device["cpu x1"]["cost_to_target"]) == ("not measured", "0.02 EUR")
    assert "no run reached the target, so no device is named" in cheapest_to_target([slow])


def test_energies_of_different_scopes_are_each_named_never_pooled_and_said_not_comparable():
    from tasks.report.energy import cell_energy, run_energy, scopes_line
    from tasks.report.tables import quality_table, train_rows

    gpu = _priced("cuda", 1, 40.0, 3.00, 5000.0, "g" * 32, samples=9)
    cpu = _priced("cpu", 1, 700.0, 0.10, 80_000.0, "c" * 32, samples=141)
    old = _priced("cpu", 1, 710.0, 0.10, 90_000.0, "o" * 32, samples=None)  # recorded before readings were counted
    assert gpu.record.energy.scope == "GPU board" and cpu.record.energy.scope == "CPU package"
    assert gpu.record.energy.mlflow_params()["energy_scope"] == "GPU board" and gpu.record.energy.mlflow_metrics()["energy_samples"] == 9
    rows = train_rows([gpu, cpu, old])
    assert {r["energy"] for r in rows} == {"5000 J (GPU board, 9 readings)", "80,000 J (CPU package, 141 readings)",
                                           "90,000 J (CPU package, readings not counted)"}
    assert scopes_line(rows).startswith("The energies above are of different scopes (CPU package, GPU board)")
    assert scopes_line([r for r in rows if r["device"] == "cpu x1"]) == ""  # one scope: nothing to say
    # one cell whose runs were measured by different counters: a median per scope, never one across them
    mixed = cell_energy([run_energy(gpu.record.energy), run_energy(cpu.record.energy), run_energy(old.record.energy)])
    assert mixed["energy"] == ("CPU package: 85,000 J [80,000–90,000], n=2, 141 readings; "
                               "GPU board: 5000 J (1 run: no interval), 9 readings")
    assert scopes_line([mixed]) != "" and scopes_line(quality_table([cpu, old])) == ""


def test_the_verdict_names_the_smallest_stride_at_which_the_surrogate_is_cheaper_or_says_none_is():
    from tasks.workloads.karman.report import stride_verdicts

    def row(device, stride, ratio, horizon):
        return {"device": device, "stride": stride, "surrogate_vs_solver": ratio, "horizon_vorticity": horizon, "steps": 60,
                "setting": ("m", 60, "circle-re105", "None", 0, "long"), "regime": "interpolation"}

    lines = stride_verdicts([row("cpu", 1, 0.2, 58), row("cpu", 8, 1.4, 12), row("cpu", 6, 1.1, 13), row("cpu", 6, 1.06, 20),
                             row("cuda", 1, 0.5, 60), row("cuda", 2, float("nan"), 60)])
    # of the two at k = 6, the one that held longer
    assert lines[0] == ("- On cpu, the surrogate is cheaper than the solver from stride k = 6 on: 1.1x cheaper per unit of simulated "
                        "time, at vorticity relative L2 within the threshold for 20 network steps (120 stored frames) of 60 on "
                        "circle-re105 (interpolation).")
    assert lines[1] == "- On cuda, at no stride measured (k = 1) is the surrogate cheaper than the solver: the solver is 2x faster per unit of simulated time."
    assert stride_verdicts([]) == []


def test_a_run_that_learned_nothing_is_marked_and_left_out_of_the_ranking():
    from tasks.common.records import TrainRecord
    from tasks.report.ranking import ranking, unranked_line
    from tasks.report.reading import Entry
    from tasks.report.tables import train_rows

    def digits(run_id: str, batch: str, accuracy: float) -> Entry:
        record = TrainRecord.from_mlflow({"workload": "digits", "device": "cpu", "world_size": "1", "batch_size": batch, "framework": "torch"},
                                         {"time_per_epoch_s": 2.0, "train_time_s": 20.0, "target_reached": 1.0, "time_to_target_s": 8.0}, True)
        return Entry(run_id, "digits-torch-cpu-b" + batch, "FINISHED", "", record.model_copy(update={"test": {"accuracy": accuracy}}))

    rows = train_rows([digits("a" * 32, "4", 0.1), digits("b" * 32, "64", 0.97)])
    diverged = next(r for r in rows if r["batch_size"] == 4)
    assert diverged["learned_nothing"].startswith("test accuracy 0.1 is at chance (1/10")
    table = ranking(rows)["digits"]
    assert [r["batch_size"] for r in table] == [64]  # the run at chance is not ranked, even though it 'reached' its target
    line = unranked_line(rows)
    assert line.startswith("Left out of the ranking, as they learned nothing: " + "a" * 32 + " (digits torch cpu x1 b4: test accuracy 0.1")
