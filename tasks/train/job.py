"""The training job (child process): one run of a TrainPlan, any workload in any framework, through the one training loop.

One code path for every device: torch's ``cpu`` and ``cuda`` run one process per device with
torchrun's environment (DistributedDataParallel) when the run asks for more than one, ``xla`` runs one process over
all cores with SPMD; TensorFlow runs one process under its strategy, or one per worker. Rank 0 talks
to MLflow, writes the checkpoint and returns the run's record; every rank reads its own slice of
each global batch.
"""

import contextlib
import logging
import socket

from tasks.common.tracking.names import Tag
from tasks.common.records import RECORD_FILE, TrainConfig, TrainRecord
from tasks.common.tracking.runs import Run, client_for, code_version, system_metrics
from tasks.common.runtimes import loop
from tasks.common.config.frameworks import open_runtime
from tasks.common.runtimes.mlperf import LOG_FILE as MLPERF_LOG, RULESET, MLPerfLog, compliance
from tasks.common.measures.energy import EnergyMeter, energy_record
from tasks.common.measures.utilisation import devices_used, utilisation
from tasks.train.plan import TrainJob
from tasks.workloads import framework_module, get_workload

log = logging.getLogger("karman.train")
SYSTEM_METRICS_EVERY_S = 5


class MlflowRecorder:
    """The loop's measurements into the run (rank 0): step metrics in batches, epoch metrics by epoch."""

    def __init__(self, run: Run):
        self.run = run

    def steps(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        self.run.log_step_metrics(rows)

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.run.log_metrics(metrics, step=epoch)


def run_training(job: dict) -> dict | None:
    """Train one configuration; rank 0 returns the run's record, other ranks None."""
    job = TrainJob.model_validate(job)
    plan, settings, batch_size, run_id = job.plan, job.settings, job.batch_size, job.run_id
    spec, resume = plan.spec, plan.resume is not None
    runtime = open_runtime(plan)
    if not runtime.is_main:  # one voice per run: rank 0 reports
        log.setLevel(logging.WARNING)
    mllog = None
    try:
        if runtime.is_main:  # the run's MLPerf-format log, from the set-up on (a resumed run appends its second part)
            run_dir = settings.run_dir(run_id)
            run_dir.mkdir(parents=True, exist_ok=True)
            mllog = MLPerfLog(run_dir / MLPERF_LOG)
            mllog.init_start()
        workload = get_workload(spec.workload)
        data = workload.prepare(settings, spec, main=runtime.is_main)
        trainer = framework_module(workload, plan.framework).build(data, spec, batch_size, runtime)
        if lacking := loop.missing_members(trainer, loop.Trainer):
            raise TypeError(f"the {workload.name} trainer in {plan.framework} ({type(trainer).__name__}) lacks {', '.join(lacking)} of the loop's Trainer")
        record = TrainRecord(config=TrainConfig(
            workload=workload.name, framework=runtime.framework, framework_version=runtime.version, device=spec.device,
            device_name=runtime.description, world_size=runtime.world_size, strategy=runtime.strategy, threads=runtime.threads,
            batch_size=batch_size, dataset=spec.dataset, dataset_digest=data.dataset_digest, train_samples=trainer.samples,
            data_in_memory=data.in_memory, split=data.split, host=socket.gethostname(), code_version=code_version(),
            spec=spec, workload_params=trainer.params, speed=trainer.speed))
        run = Run(client_for(settings), run_id) if runtime.is_main else None
        meter = EnergyMeter(spec.device, runtime.world_size) if run is not None else contextlib.nullcontext()
        if run is not None and not resume:
            run.log_params(record.mlflow_params())
            run.log_dict(record.model_dump(mode="json"), RECORD_FILE)
        log.info("training %s with %s %s on %s: %d samples (%s), batch %d, %d steps/epoch", workload.name, runtime.framework, runtime.version,
                 runtime.description, trainer.samples, "held in memory" if data.in_memory else "read per batch", batch_size,
                 trainer.samples // batch_size)
        run_dir = settings.run_dir(run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        monitor = system_metrics(settings, run_id, SYSTEM_METRICS_EVERY_S, resume) if run is not None else contextlib.nullcontext()
        recorder = loop.NoRecorder()
        if run is not None:
            recorder = mllog
            mllog.inner = MlflowRecorder(run)
            mllog.run_start(workload.name, runtime.framework, runtime.description, batch_size, spec.seed, trainer.samples,
                            "; ".join(data.split.get("val", [])) or "none", trainer.learning_rate(), next(iter(trainer.headline), None))
        with monitor, meter:
            summary = loop.train(trainer, runtime, recorder, spec, batch_size, run_dir / runtime.checkpoint, log, resume=resume, run_id=run_id)
        if run is None:
            return None
        mllog.run_stop(summary.target_reached, summary.epochs)
        mllog.close()
        broken = compliance(mllog.path)
        run.log_artifact(mllog.path, "mlperf")
        verdict = (f"passes MLCommons' compliance checker (training {RULESET}, the rules that apply outside MLPerf's benchmarks)"
                   if not broken else f"compliance checker (training {RULESET}): {len(broken)} rule(s) broken: {broken[0][:300]}")
        run.set_tags({Tag.MLPERF: verdict})
        log.info("MLPerf log (mlperf/%s): %s", mllog.path.name, verdict)
        tested = trainer.finish(run_dir, run, settings) or {}  # the test split's scores, for workloads that score one
        energy = energy_record(meter, summary, spec.device, devices_used(runtime, spec.device, runtime.world_size)[0], settings)
        logged = run.client.get_run(run_id).data.params  # a resumed run's first part may have logged them: params are written once
        run.log_params({k: v for k, v in energy.mlflow_params().items() if k not in logged})
        record = record.model_copy(update={"summary": summary, "test": tested, "energy": energy,
                                           "utilisation": utilisation(trainer, runtime, summary, spec, settings)})
        run.log_metrics(record.mlflow_metrics())
        run.log_dict(record.model_dump(mode="json"), RECORD_FILE)
        run.set_tags({Tag.TARGET: "reached" if summary.target_reached else "not reached"})
        if summary.resumes:  # MLPerf's rule: the clock of a time-to-train never pauses
            run.set_tags({Tag.TIME_TO_TRAIN: f"excluded: resumed {summary.resumes} time(s)"})
        if workload.learned_nothing and (why := workload.learned_nothing(tested)):
            run.set_tags({Tag.LEARNED_NOTHING: why})
            log.warning("the run learned nothing: %s", why)
        return record.model_dump(mode="json")
    finally:
        if mllog is not None:
            mllog.close()
        runtime.close()
