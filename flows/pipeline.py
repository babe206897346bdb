"""The pipeline's Prefect flows: generate, train, infer, aggregate, and the demo that chains them."""

import time

from prefect import flow, get_run_logger

from tasks.aggregate import ablation_row, aggregate_runs, write_ablation
from tasks.cells import cell_error, cell_key, finished_cell, interrupted_cell, record_failed_cell
from tasks.generate import run_sweep
from tasks.infer import rollout
from tasks.settings import Settings
from tasks.specs import AblationSpec, AggregateSpec, BenchmarkSpec, DemoSpec, GenerateSpec, InferSpec, TrainSpec, ValidateSpec
from tasks.train import check_training_input, log_study_table, plan_world, probe_device, resume_plan, sweep_run, train_model
from tasks.validation import validate_solver as run_validation


def _settings() -> Settings:
    return Settings.from_env().require_writable()


@flow(name="generate", log_prints=False)
def generate(spec: GenerateSpec = GenerateSpec()) -> dict:
    """Simulate a parameter sweep of channel flows into a zarr dataset (skips finished simulations)."""
    return run_sweep(_settings(), spec)


@flow(name="train")
def train(spec: TrainSpec = TrainSpec()) -> dict:
    """Train Pix2Pix on a dataset on the chosen device: one run per batch size (several make a sweep,
    whose runs are children of one parent run holding the study's table), or resume an interrupted run."""
    settings = _settings()
    resume_id = spec.resume
    if resume_id:
        spec, batch_sizes = resume_plan(settings, spec)
        batch_sizes = [batch_sizes]
    else:
        batch_sizes = spec.batch_sizes
    probed = probe_device(spec.device, spec.world_size) if spec.device != "cpu" else None
    world, procs = plan_world(spec, probed)
    check_training_input(settings, spec, batch_sizes, world)
    if len(batch_sizes) == 1:
        result = train_model(settings, spec, batch_sizes[0], world, procs, resume_run_id=resume_id)
        return {**result, "device_kind": spec.device}
    logger = get_run_logger()
    results = []
    with sweep_run(settings, spec) as parent:
        for b in batch_sizes:
            state = train_model(settings, spec, b, world, procs, parent_run_id=parent.run_id, return_state=True)
            if state.is_completed():
                results.append({**state.result(), "device_kind": spec.device, "status": "FINISHED"})
            else:  # one failed configuration (too large a batch, ...) does not stop the sweep
                logger.error("batch size %d failed: %s", b, state.message)
                results.append({"batch_size": b, "device_kind": spec.device, "world_size": world, "status": "FAILED", "error": state.message})
        rows = log_study_table(settings, parent.run_id, results)
        if not any(r["status"] == "FINISHED" for r in results):
            raise RuntimeError(f"every configuration of the sweep failed; first: {results[0].get('error')}")
    return {"parent_run_id": parent.run_id, "runs": results, "table": rows,
            "run_id": next(r["run_id"] for r in reversed(results) if r["status"] == "FINISHED")}


@flow(name="infer")
def infer(spec: InferSpec = InferSpec()) -> dict:
    """Roll a trained generator out on a held-out simulation and score it against the solver."""
    return rollout(_settings(), spec)


@flow(name="aggregate")
def aggregate(spec: AggregateSpec = AggregateSpec()) -> dict:
    """Build comparison tables, figures and a report from the experiment's runs."""
    return aggregate_runs(_settings(), spec)


@flow(name="validate-solver")
def validate_solver(spec: ValidateSpec = ValidateSpec()) -> dict:
    """Check the solver against the Schäfer-Turek cylinder benchmark over a ladder of resolutions."""
    return run_validation(_settings(), spec)


@flow(name="ablate")
def ablate(spec: AblationSpec = AblationSpec()) -> dict:
    """Train each recipe variant on the same data and budget, roll it out on the test simulation, and
    tabulate one-step error, useful horizons, Strouhal error and training time."""
    settings = _settings()
    logger = get_run_logger()
    rows, simulation = [], "?"
    for variant in spec.variants:
        try:
            trained = train(spec.train_spec(variant))
            rolled = infer(InferSpec(model_run=trained["run_id"], steps=spec.steps))
        except Exception as exc:  # one failed variant does not stop the others; its row says so
            logger.error("variant %s failed: %s", variant, exc)
            rows.append(ablation_row(variant, {"run_id": "FAILED", "epochs": 0}, {}))
            continue
        simulation = rolled["simulation"]
        rows.append(ablation_row(variant, trained, rolled))
        logger.info("variant %s: vorticity horizon %d steps, one-step vorticity error %.3g", variant,
                    rows[-1]["horizon_vorticity"], rows[-1]["one_step_rel_l2_vorticity"])
    if all(r["train_run"] == "FAILED" for r in rows):
        raise RuntimeError("every variant of the ablation failed; see the log")
    return write_ablation(settings, spec.name, spec.model_dump(), rows, simulation)


@flow(name="demo")
def demo(spec: DemoSpec = DemoSpec()) -> dict:
    """The quick CPU pipeline: simulate, train, roll out, report; every stage logged to MLflow."""
    settings = _settings()
    data = generate(spec.generate)
    trained = train(spec.train)
    inferred = infer(spec.infer.model_copy(update={"model_run": trained["run_id"]}))
    report = aggregate(spec.aggregate)
    return {
        "tracking_uri": settings.tracking_uri,
        "experiment": settings.experiment,
        "runs": {"generate": data["run_id"], "train": trained["run_id"], "infer": inferred["run_id"], "aggregate": report["run_id"]},
        "dataset": {"name": data["dataset"], "digest": data["digest"], "path": data["path"], "simulations": len(data["simulations"])},
        "report": report["report"],
    }


def deployment_for(kind: str, device: str, pools: dict[str, str]) -> str | None:
    """'<flow>/<pool>' of the deployment that runs ``kind`` cells on ``device``; None to run them here."""
    pool = pools.get(device)
    return None if pool in (None, "local") else f"{kind}/{pool}"


def check_deployments(spec: BenchmarkSpec) -> None:
    """UserError naming every deployment the matrix needs that the Prefect API does not have."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from tasks.errors import UserError

    needed = sorted({d for kind, devices in (("train", spec.devices), ("infer", spec.infer_devices)) for device in devices
                     if (d := deployment_for(kind, device, spec.pools))})
    if not needed:
        return
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():  # the temporary local API has no deployments
        raise UserError(f"deployment(s) {', '.join(needed)} not found: no Prefect server is configured (PREFECT_API_URL); "
                        "start one and deploy (infra/start-prefect-server.sh, prefect deploy --all), or map the device to 'local' in pools")
    missing = []
    with get_client(sync_client=True) as client:
        for name in needed:
            try:
                client.read_deployment_by_name(name)
            except ObjectNotFound:
                missing.append(name)
    if missing:
        raise UserError(f"deployment(s) {', '.join(missing)} not found on the Prefect API; deploy them (prefect deploy --all) "
                        "or map the device to 'local' in pools")


def _run_cell(kind: str, spec, settings: Settings, deployment: str | None) -> dict:
    """Run one cell as its own flow run unless MLflow already holds its finished run; never raises for
    a failed cell (the benchmark goes on and the report shows it)."""
    logger = get_run_logger()
    done = finished_cell(settings, spec.cell)
    label = f"{kind} cell {spec.cell}"
    if done:
        logger.info("%s: finished run %s found, skipped", label, done)
        return {"cell": spec.cell, "kind": kind, "status": "SKIPPED", "run_id": done}
    if kind == "train" and (stale := interrupted_cell(settings, spec.cell)):
        from tasks.errors import UserError

        try:  # continue from its last checkpoint if it left one here
            resume_plan(settings, spec.model_copy(update={"resume": stale}))
            spec = spec.model_copy(update={"resume": stale})
            logger.info("%s: resuming interrupted run %s from its last checkpoint", label, stale)
        except UserError as exc:
            logger.info("%s: earlier run %s cannot be resumed (%s); starting afresh", label, stale, exc)
    params = {"spec": spec.model_dump(mode="json")}
    started_ms = int(time.time() * 1000)
    if deployment:
        from prefect.deployments import run_deployment

        logger.info("%s: running on deployment %s", label, deployment)
        flow_run = run_deployment(deployment, parameters=params, as_subflow=True, flow_run_name=f"{kind}-{spec.cell}")
        ok, message = flow_run.state.is_completed(), flow_run.state.message
    else:
        state = (train if kind == "train" else infer)(spec, return_state=True)
        ok, message = state.is_completed(), state.message
    done = finished_cell(settings, spec.cell) if ok else None
    if done is None:
        error = cell_error(settings, spec.cell, started_ms)
        if error is None:  # it failed before opening its own run: record one so the report shows it
            error = message or "no finished run was recorded"
            shown = ({"device": spec.device, "batch_size": spec.batch_sizes[0]} if kind == "train"
                     else {"device": spec.device, "mode": spec.mode, "workers": spec.workers})
            record_failed_cell(settings, kind, f"{kind}-{spec.device}-cell-{spec.cell}", spec.cell, error, shown)
        logger.error("%s failed: %s", label, error)
        return {"cell": spec.cell, "kind": kind, "status": "FAILED", "error": error}
    return {"cell": spec.cell, "kind": kind, "status": "FINISHED", "run_id": done}


@flow(name="benchmark")
def benchmark(spec: BenchmarkSpec = BenchmarkSpec()) -> dict:
    """The benchmark matrix: generate, train every (framework, device, batch size) cell, roll the first
    trained model out in every (device, mode, workers) cell, and aggregate; finished cells are skipped."""
    settings = _settings()
    logger = get_run_logger()
    check_deployments(spec)
    data = generate(spec.generate)
    cells = []
    for framework in spec.frameworks:
        for device in spec.devices:
            for batch in spec.batch_sizes:
                for seed in range(spec.train.seed, spec.train.seed + spec.repeats):
                    cell = spec.train.model_copy(update={"device": device, "batch_sizes": [batch], "seed": seed})
                    cell = cell.model_copy(update={"cell": cell_key(f"train/{framework}", cell, data["digest"])})
                    cells.append({**_run_cell("train", cell, settings, deployment_for("train", device, spec.pools)),
                                  "framework": framework, "device": device, "batch_size": batch, "seed": seed})
    model = next((c["run_id"] for c in cells if c["status"] != "FAILED"), None)
    if model is None:
        logger.error("no training cell finished; the rollout cells are skipped")
    else:
        for device, mode, workers in spec.infer_cells():
            cell = spec.infer.model_copy(update={"model_run": model, "device": device, "mode": mode, "workers": workers})
            cell = cell.model_copy(update={"cell": cell_key("infer", cell, data["digest"])})
            cells.append({**_run_cell("infer", cell, settings, deployment_for("infer", device, spec.pools)),
                          "device": device, "mode": mode, "workers": workers})
    report = aggregate(spec.aggregate)
    failed = [c for c in cells if c["status"] == "FAILED"]
    logger.info("benchmark: %d cells, %d run, %d skipped as finished, %d failed", len(cells),
                sum(c["status"] == "FINISHED" for c in cells), sum(c["status"] == "SKIPPED" for c in cells), len(failed))
    return {"dataset": {"name": data["dataset"], "digest": data["digest"]}, "cells": cells, "report": report["report"],
            "aggregate_run_id": report["run_id"], "failed": len(failed)}

