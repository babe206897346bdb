"""The pipeline's Prefect flows: generate, train, infer, aggregate, validate-solver, ablate, the demo and the benchmark matrix.

Every flow run is named and tagged from its parameters (``train cpu b8``; stage,
device, batch size, mode), so the Prefect UI's runs list tells them apart and filters them.
"""

import itertools
import signal
import threading
import time
from pathlib import Path

from prefect import flow, get_run_logger
from pydantic import ValidationError
from pydantic.json_schema import SkipJsonSchema

from flows.lanes import device_slot, run_lanes
from flows.matrix import BenchmarkPlan, Job, WorkloadPlan, plan_benchmark
from tasks.common.tracking.cells import cell_error, finished_cell, interrupted_cell, keyed, record_failed_cell
from tasks.common.config.errors import UserError, signal_name
from tasks.common.process import lifetime
from tasks.common.tracking.names import Tag, infer_label, infer_run_name, train_label, train_run_name
from tasks.common.process.progress import Progress
from tasks.common.config.settings import Settings
from tasks.common.specs import AggregateSpec, BenchmarkSpec, DemoSpec, GenerateSpec, InferSpec, TrainSpec
from tasks.workloads.karman.specs import AblationSpec, ValidateSpec
from tasks.common.stores.store import load_manifest
from tasks.common.tracking.runs import mlflow_run, reap_orphans, run_url
from tasks.common.config.frameworks import DEFAULT
from tasks.generate.task import generate_dataset
from tasks.infer.task import rollout
from tasks.report.task import aggregate_runs, interval_metrics, publish_artifacts, write_ablation
from tasks.train.plan import plan_training, resume_plan
from tasks.train.task import log_study_table, register_surrogate, sweep_run, train_model
from tasks.workloads.karman.validate.task import validate_solver as run_validation
from tasks.workloads import get_workload, with_own_defaults

# The MLflow run id to file a flow's run under as a child. The benchmark and the demo set it; run forms
# leave it out (no JSON schema), and the flow still takes it.
ParentRun = SkipJsonSchema[str | None]
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # the signals that stop a benchmark at its running cell


def _settings() -> Settings:
    return Settings.from_env().require_writable()


def _flow_spec(model):
    """The running flow's ``spec`` parameter as a ``model``, or None where it does not validate."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    value = (ctx.parameters or {}).get("spec") if ctx else None
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value or {})
    except ValidationError:
        return None


def _named(model, name_of):
    """A flow_run_name callable: the name ``name_of(spec)`` gives the run's spec."""
    def name() -> str:
        spec = _flow_spec(model)
        return name_of(spec) if spec is not None else f"{model.__name__.removesuffix('Spec').lower()} (invalid parameters)"

    return name


def _tag_run(*tags: str) -> None:
    """Add ``tags`` to the running flow run (whether started here, as a subflow or from a deployment),
    so the Prefect UI's runs list filters on them."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return
    try:
        with get_client(sync_client=True) as client:
            present = set(client.read_flow_run(ctx.flow_run.id).tags)  # the API replaces the list: merge here
            if not set(tags) <= present:
                client.update_flow_run(ctx.flow_run.id, tags=sorted(present | set(tags)))
    except Exception as exc:  # a missing tag is no reason to fail a run
        get_run_logger().warning("flow run tags not set: %s", exc)


def _own(spec):
    """``spec`` with what it left unset taken from its workload's entry (tasks.workloads.with_own_defaults), or as it
    is where its workload is unknown (the flow then refuses it in one line)."""
    try:
        return with_own_defaults(spec)
    except UserError:
        return spec


@flow(name="generate", log_prints=False, flow_run_name=_named(GenerateSpec, lambda s: f"generate {_own(s).dataset}"))
def generate(spec: GenerateSpec = GenerateSpec(), parent_run: ParentRun = None) -> dict:
    """Write a workload's dataset into the store (a no-op for a complete one), named after the workload unless the
    request names it: karman simulates a parameter sweep of channel flows (skipping finished simulations), digits
    stores its MNIST images, har its activity windows, calo its showers."""
    spec = _own(spec)
    workload = get_workload(spec.workload)
    _tag_run("stage:generate", f"workload:{spec.workload}", f"dataset:{spec.dataset}")
    return generate_dataset(_settings(), spec, workload, parent_run_id=parent_run)


@flow(name="train", flow_run_name=_named(TrainSpec, lambda s: train_label(_own(s))))
def train(spec: TrainSpec = TrainSpec(), parent_run: ParentRun = None) -> dict:
    """Train a workload's network on a dataset on the chosen device, at the workload's own dataset, batch size and
    epochs unless the request gives them: one run per batch size (several make a sweep, whose runs are children of one
    parent run holding the study's table), or resume an interrupted run."""
    spec = _own(spec)
    _tag_run("stage:train", f"workload:{spec.workload}", f"framework:{spec.framework}", f"device:{spec.device}", *(f"batch:{b}" for b in spec.batch_sizes), f"dataset:{spec.dataset}")
    with device_slot(get_run_logger()):
        return _train(spec, parent_run)


def _train(spec: TrainSpec, parent_run: str | None) -> dict:
    settings = _settings()
    logger = get_run_logger()
    plan = plan_training(settings, spec, logger)
    spec, world = plan.spec, plan.world
    if len(plan.batch_sizes) == 1:
        result = train_model(settings, plan, plan.batch_sizes[0], parent_run_id=parent_run)
        return {**result, "device_kind": spec.device}
    results = []
    with sweep_run(settings, spec, parent_run) as parent:
        for b in plan.batch_sizes:
            state = train_model(settings, plan, b, parent_run_id=parent.run_id, return_state=True)
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


@flow(name="infer", flow_run_name=_named(InferSpec, infer_label))
def infer(spec: InferSpec = InferSpec(), parent_run: ParentRun = None) -> dict:
    """Roll a trained generator out on a held-out simulation and score it against the solver."""
    _tag_run("stage:infer", f"device:{spec.device}", f"mode:{spec.mode}", f"workers:{spec.workers}")
    with device_slot(get_run_logger()):
        return rollout(_settings(), spec, parent_run_id=parent_run)


@flow(name="aggregate", flow_run_name=_named(AggregateSpec, lambda s: f"aggregate {s.name}"))
def aggregate(spec: AggregateSpec = AggregateSpec(), parent_run: ParentRun = None) -> dict:
    """Build comparison tables, figures and a report over one benchmark's or demo's runs (or all)."""
    _tag_run("stage:aggregate", f"report:{spec.name}")
    report = aggregate_runs(_settings(), spec, parent_run_id=parent_run)
    if parent_run is None:  # a benchmark's or the demo's report is published by that flow, on its own run
        publish_artifacts(report)
    return report


@flow(name="validate-solver", flow_run_name=_named(ValidateSpec, lambda s: f"validate solver {s.case} {s.backend}"))
def validate_solver(spec: ValidateSpec = ValidateSpec()) -> dict:
    """Check the solver against the Schäfer-Turek cylinder benchmark over a ladder of resolutions."""
    return run_validation(_settings(), spec)


@flow(name="ablate", flow_run_name=_named(AblationSpec, lambda s: f"ablate {s.name} ({len(s.variants)} variants)"))
def ablate(spec: AblationSpec = AblationSpec()) -> dict:
    """Train each recipe variant on the same data and budget (once per seed), roll it out on the test
    simulation and on every simulation of the extra dataset, and tabulate one-step error, useful
    horizons, phase and frequency errors, energy and shedding over the long rollouts, and training time."""
    settings = _settings()
    logger = get_run_logger()
    # the extra dataset is read before anything trains: a missing one ends the command at once
    extra = sorted(load_manifest(settings.dataset_dir(spec.extra_dataset))["simulations"]) if spec.extra_dataset else []
    workload = get_workload(spec.train_spec(spec.variants[0], spec.seed).workload)  # whose recipe the variants change
    if workload.ablation is None:
        raise UserError(f"workload {workload.name} has no training recipe to ablate")
    results, simulation = [], "?"
    for variant, seed in itertools.product(spec.variants, spec.seeds()):
        try:
            trained = train(spec.train_spec(variant, seed))
            rolled = infer(InferSpec(model_run=trained["run_id"], steps=spec.steps))
            long = [infer(InferSpec(model_run=trained["run_id"], dataset=spec.extra_dataset, simulation=sim, steps=spec.extra_steps))
                    for sim in extra]
        except Exception as exc:  # one failed variant does not stop the others; its row says so
            logger.error("variant %s, seed %d failed: %s", variant, seed, exc)
            results.append((variant, seed, {"run_id": "FAILED", "epochs": 0}, {}, []))
            continue
        simulation = rolled["simulation"]
        results.append((variant, seed, trained, rolled, long))
        logger.info("variant %s, seed %d: vorticity horizon %s steps, one-step vorticity error %.3g", variant, seed,
                    rolled.get("horizon_vorticity"), rolled.get("one_step_rel_l2_vorticity", float("nan")))
    if all(trained["run_id"] == "FAILED" for _, _, trained, _, _ in results):
        raise RuntimeError("every variant of the ablation failed; see the log")
    params = spec.model_dump()
    rows, markdown = workload.ablation(spec.name, params, results, simulation, extra)
    return write_ablation(settings, spec.name, params, rows, markdown)


@flow(name="demo", flow_run_name="demo")
def demo(spec: DemoSpec = DemoSpec()) -> dict:
    """The quick CPU pipeline: simulate, train, roll out, report; every stage a child of one MLflow run."""
    _tag_run("stage:demo")
    settings = _settings()
    logger = get_run_logger()
    description = (f"The demo pipeline: simulate dataset `{spec.generate.dataset}`, train Pix2Pix on CPU (batch "
                   f"{spec.train.batch_sizes[0]}, {spec.train.time_budget or spec.train.epoch_limit:g} {'s' if spec.train.time_budget else 'epochs'}), "
                   f"roll it out {spec.infer.steps} steps against the solver, report `{spec.aggregate.name}`; each stage is a child run.")
    with mlflow_run(settings, "demo", "demo", params={"dataset": spec.generate.dataset}, description=description) as parent:
        data = generate(spec.generate, parent_run=parent.run_id)
        trained = train(spec.train, parent_run=parent.run_id)
        inferred = infer(spec.infer.model_copy(update={"model_run": trained["run_id"]}), parent_run=parent.run_id)
        parent.client.log_dict(parent.run_id, {"runs": [trained["run_id"], inferred["run_id"]]}, "runs.json")
        report = aggregate(spec.aggregate.model_copy(update={"runs": parent.run_id}), parent_run=parent.run_id)
        publish_artifacts(report)
        for path in (report["report"], report["html"], *report["figures"]):
            parent.log_artifact(Path(path), "report")
    logger.info("report: %s; runs: %s", report["report"], run_url(settings, parent.run_id))
    return {
        "tracking_uri": settings.tracking_uri,
        "experiment": settings.experiment,
        "runs": {"demo": parent.run_id, "generate": data["run_id"], "train": trained["run_id"], "infer": inferred["run_id"], "aggregate": report["run_id"]},
        "dataset": {"name": data["dataset"], "digest": data["digest"], "path": data["path"], "simulations": len(data["simulations"])},
        "report": report["report"],
    }


def _cell_label(kind: str, spec) -> str:
    return train_label(spec) if kind == "train" else infer_label(spec)


def _run_cell(kind: str, spec, settings: Settings, deployment: str | None, parent_run: str, framework: str = DEFAULT) -> dict:
    """Run one cell as its own flow run (a child of the benchmark's MLflow run ``parent_run``) unless
    MLflow already holds its finished run; never raises for a failed cell (the benchmark goes on and
    the report shows it), nor for one a stop signal stopped (status KILLED: resumable, the benchmark stops after it).
    ``framework``: a rollout cell's model's, for the name of a run it failed to open."""
    logger = get_run_logger()
    label = f"{_cell_label(kind, spec)} [cell {spec.cell}]"
    done = finished_cell(settings, spec.cell)
    if done:
        return {"cell": spec.cell, "kind": kind, "label": label, "status": "SKIPPED", "run_id": done, "note": "finished earlier, reused"}
    if kind == "train" and (stale := interrupted_cell(settings, spec.cell)):
        from tasks.common.config.errors import UserError

        try:  # continue from its last checkpoint if it left one here
            resume_plan(settings, spec.model_copy(update={"resume": stale}))
            spec = spec.model_copy(update={"resume": stale})
            logger.info("%s: resuming interrupted run %s from its last checkpoint", label, stale)
        except UserError as exc:
            logger.info("%s: earlier run %s cannot be resumed (%s); starting afresh", label, stale, exc)
    params = {"spec": spec.model_dump(mode="json"), "parent_run": parent_run}
    started_ms = int(time.time() * 1000)
    try:
        if deployment:
            from prefect.deployments import run_deployment

            logger.info("%s: running on deployment %s", label, deployment)
            flow_run = run_deployment(deployment, parameters=params, as_subflow=True, flow_run_name=_cell_label(kind, spec),
                                      tags=[f"stage:{kind}", f"device:{spec.device}"])
            ok, message = flow_run.state.is_completed(), flow_run.state.message
        else:
            state = (train if kind == "train" else infer)(spec, parent_run=parent_run, return_state=True)
            ok, message = state.is_completed(), state.message
    except BaseException as exc:  # a stop signal that came outside the child (it stops the child itself otherwise)
        if lifetime.signal_of(exc) not in STOP_SIGNALS:
            raise
        ok, message = False, str(exc)
    done = finished_cell(settings, spec.cell) if ok else None
    if done is None:
        found = cell_error(settings, spec.cell, started_ms, getattr(spec, "resume", None))
        if found is None and lifetime.received():  # stopped before it opened its run: nothing to record
            return {"cell": spec.cell, "kind": kind, "label": label, "status": "KILLED", "run_id": None, "error": message or "stopped"}
        if found is None:  # it failed before opening its own run: record one so the report shows it
            error = message or "no finished run was recorded"
            shown = ({"device": spec.device, "batch_size": spec.batch_sizes[0]} if kind == "train"
                     else {"device": spec.device, "mode": spec.mode, "workers": spec.workers})
            name = train_run_name(spec, spec.batch_sizes[0]) if kind == "train" else infer_run_name(spec, framework)  # the name its run would have had
            run_id = record_failed_cell(settings, kind, name, spec.cell, error, shown, parent_run)
            status = "FAILED"
        else:
            run_id, error, status = found
        return {"cell": spec.cell, "kind": kind, "label": label, "status": "KILLED" if status == "KILLED" else "FAILED",
                "run_id": run_id, "error": error}
    return {"cell": spec.cell, "kind": kind, "label": label, "status": "FINISHED", "run_id": done}


def _dataset_cell(planned: WorkloadPlan, settings: Settings, parent_run: str) -> dict:
    """A workload's dataset, generated here, or for a swept workload's sweep on a GPU (``generate.device`` cuda) on its
    planned ``generate/<pool>`` deployment (into the shared data root)."""
    gen, deployment = planned.generate, planned.generate_deployment
    if deployment is None:
        return generate(gen, parent_run=parent_run)
    from prefect.deployments import run_deployment

    get_run_logger().info("dataset %s: simulating on deployment %s", gen.dataset, deployment)
    flow_run = run_deployment(deployment, parameters={"spec": gen.model_dump(mode="json"), "parent_run": parent_run}, as_subflow=True,
                              flow_run_name=f"generate {gen.dataset}", tags=["stage:generate", f"device:{gen.device}"])
    if not flow_run.state.is_completed():
        raise RuntimeError(f"dataset {gen.dataset} on deployment {deployment} ended {flow_run.state.name}: {flow_run.state.message}")
    folder = settings.dataset_dir(gen.dataset)
    return {"dataset": gen.dataset, "path": str(folder), "digest": load_manifest(folder)["digest"]}


@flow(name="benchmark", flow_run_name=_named(BenchmarkSpec, lambda s: f"benchmark {s.aggregate.name}"))
def benchmark(spec: BenchmarkSpec = BenchmarkSpec()) -> dict:
    """The benchmark matrix: per workload, generate its data and train every (framework, device, batch
    size, seed) cell; roll each framework's first trained model of a workload with rollouts out in every
    (device, mode, workers) cell; aggregate; register the best trained model of each workload that
    registers. Finished cells are skipped. One MLflow run holds it all: the cells are its children, the
    report its artifacts. Everything is planned from the spec first (flows.matrix.plan_benchmark)."""
    _tag_run("stage:benchmark", f"benchmark:{spec.aggregate.name}", *(f"device:{d}" for d in spec.devices),
             *(f"workload:{w}" for w in spec.workloads))
    settings = _settings()
    reap_orphans(settings, get_run_logger())  # cells left RUNNING by a killed worker on this host become KILLED: resumable
    return _run_plan(plan_benchmark(spec), settings)


def _stopped_words(cells: list[dict], report: str) -> str:
    """How a benchmark stopped by a signal ended, in one line: the cells it stopped, those it did not start, its report."""
    killed = [f"{c['label']} (run {c['run_id']})" if c.get("run_id") else c["label"] for c in cells if c["status"] == "KILLED"]
    idle = sum(c["status"] == "NOT STARTED" for c in cells)
    return (f"{'; '.join(killed) or 'no cell'} stopped, {idle} cell(s) not started; report of what finished: {report}; "
            "run the benchmark again to resume (finished cells are reused, a stopped one goes on from its last checkpoint)")


def _run_plan(plan: BenchmarkPlan, settings: Settings) -> dict:
    """Run a planned benchmark: datasets, training cells, rollouts of each framework's first trained model, the report
    and the registrations, under one MLflow run."""
    logger = get_run_logger()
    for workload, frameworks in plan.skipped.items():
        if frameworks:
            logger.info("workload %s has no %s version: those cells are not part of the matrix", workload, ", ".join(frameworks))
    with mlflow_run(settings, "benchmark", f"benchmark-{plan.name}", params=plan.params, description=plan.description,
                    tags={Tag.BENCHMARK: plan.name, Tag.DEVICES: ",".join(plan.devices)}) as bench:
        logger.info("benchmark %s: %d cells; MLflow: %s", plan.name, plan.total, run_url(settings, bench.run_id))
        progress = Progress(f"cells of benchmark {plan.name} done")
        datasets = {}
        done: list[dict] = []  # as they finish
        lock = threading.Lock()
        stop: list[int] = []  # a stop signal that reached a cell without passing this command's handlers (Prefect's)

        def stopped_by() -> int | None:
            """The signal that stops the benchmark: once sent, no further cell starts (in any lane)."""
            return lifetime.received() or (stop[0] if stop else None)

        def run(job: Job) -> dict:
            unrun = {"cell": job.spec.cell, "kind": job.kind, "label": f"{_cell_label(job.kind, job.spec)} [cell {job.spec.cell}]",
                     "run_id": None, **job.shown}
            if stopped_by():
                return {**unrun, "status": "NOT STARTED"}
            started = time.monotonic()
            try:
                result = {**_run_cell(job.kind, job.spec, settings, job.deployment, bench.run_id, job.shown.get("framework", DEFAULT)),
                          **job.shown}
            except BaseException as exc:  # a stop signal while the cell was looked up or recorded, outside its run
                if lifetime.signal_of(exc) not in STOP_SIGNALS:
                    raise
                stop.append(lifetime.signal_of(exc))
                result = {**unrun, "status": "KILLED", "error": str(exc)}
            with lock:
                done.append(result)
                left = progress.update(len(done) / plan.total)
                where = run_url(settings, result["run_id"]) if result.get("run_id") else "no run"
                extra = f": {result['error']}" if result["status"] in ("FAILED", "KILLED") else f" ({result['note']})" if result.get("note") else ""
                logger.info("cell %d/%d %s: %s in %.0f s%s%s; MLflow: %s", len(done), plan.total, result["label"], result["status"],
                            time.monotonic() - started, extra, f" ({left})" if left else "", where)
            return result

        train_jobs = []
        for planned in plan.workloads:
            data = datasets[planned.cells.workload.name] = _dataset_cell(planned, settings, bench.run_id)
            bench.log_dataset(data["dataset"], data["digest"], Path(data["path"]), "training",
                              planned.cells.workload.dataset_info(settings, data["dataset"])[1])
            train_jobs += [keyed(job, f"train/{job.shown['framework']}", data["digest"]) for job in planned.train]
        cells = run_lanes(train_jobs, lambda job: job.lane, run)  # the pools' lanes at the same time
        infer_jobs = []
        for planned in plan.workloads if not stopped_by() else []:
            name = planned.cells.workload.name
            for framework in planned.cells.frameworks if planned.rollouts else []:  # its first trained model, in every rollout cell
                model = next((c["run_id"] for c in cells if c.get("workload") == name and c.get("framework") == framework
                              and c["status"] in ("FINISHED", "SKIPPED")), None)
                if model is None:
                    logger.error("no %s training cell of %s finished; its rollout cells are skipped", framework, name)
                    continue
                infer_jobs += [keyed(job, "infer", datasets[name]["digest"], model_run=model) for job in planned.rollouts
                               if job.shown["framework"] == framework]
        cells += run_lanes(infer_jobs, lambda job: job.lane, run)
        signum = stopped_by()
        counts = {s: sum(c["status"] == s for c in cells) for s in ("FINISHED", "SKIPPED", "FAILED", "KILLED", "NOT STARTED")}
        # the report of a stopped benchmark covers what finished, and says it stopped (tasks.report.reading.covered_runs)
        stopped = (f"stopped by {signal_name(signum)} with {counts['FINISHED'] + counts['SKIPPED']} of {len(cells)} cells finished"
                   if signum else None)
        bench.client.log_dict(bench.run_id, {"runs": [c["run_id"] for c in cells if c.get("run_id") and c["status"] != "KILLED"], "cells": cells,
                                             **({"stopped": stopped} if stopped else {})}, "runs.json")
        report = aggregate(plan.aggregate.model_copy(update={"runs": bench.run_id}), parent_run=bench.run_id)
        # The report on the benchmark's own runs: its Prefect artifacts and its MLflow run's artifacts.
        publish_artifacts(report)
        for path in (report["report"], report["html"], report["intervals"], *report["figures"]):
            bench.log_artifact(Path(path), "report")
        bench.log_metrics(interval_metrics(report["cell_intervals"]))  # each cell's medians, 95 % intervals and n
        # each registering workload's best model into the Model Registry; the alias 'champion' moves only to a better one
        registrations = [] if signum else [register_surrogate(settings, p.cells.workload.name, [c["run_id"] for c in cells if c["kind"] == "train"
                                                                              and c.get("workload") == p.cells.workload.name
                                                                              and c["status"] in ("FINISHED", "SKIPPED") and c.get("run_id")])
                         for p in plan.workloads if p.cells.workload.register]
        versions = [r for r in registrations if r["version"] is not None]
        if versions:
            bench.set_tags({Tag.CHAMPION: "; ".join(f"{r['name']} version {r['version']}: "
                                                    f"{'champion' if r['champion'] else 'not champion'} ({r['reason']})" for r in versions)})
        failed = [c for c in cells if c["status"] == "FAILED"]
        bench.set_tags({Tag.CELLS: f"{len(cells)}: {counts['FINISHED']} run, {counts['SKIPPED']} reused, {counts['FAILED']} failed"
                                   + (f", {counts['KILLED']} stopped, {counts['NOT STARTED']} not started" if signum else "")})
        if signum:  # the benchmark's run ends KILLED, and the command with 128 + the signal
            raise lifetime.Interrupted(signum, _stopped_words(cells, report["report"]))
    logger.info("benchmark %s: %d cells, %d run, %d skipped as finished, %d failed; report %s; MLflow: %s", plan.name, len(cells),
                counts["FINISHED"], counts["SKIPPED"], len(failed), report["report"], run_url(settings, bench.run_id))
    first = datasets[plan.workloads[0].cells.workload.name]
    return {"dataset": {"name": first["dataset"], "digest": first["digest"]},
            "datasets": {w: {"name": d["dataset"], "digest": d["digest"]} for w, d in datasets.items()}, "cells": cells, "report": report["report"],
            "benchmark_run_id": bench.run_id, "aggregate_run_id": report["run_id"], "failed": len(failed),
            # what the first registering workload registered (the settings name one registered model), or None
            "registered": registrations[0] if registrations else None}
