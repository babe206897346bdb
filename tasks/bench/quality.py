"""bench-quality: time to quality of a recipe on one device, its rollout scores and its cost against the solver's.

It trains through the same loop, runtime, workload trainer, split, normaliser, recipe, validation
and target as ``python -m flows train`` (tasks.common.runtimes.loop), in this process, with a recorder that
keeps the validations in memory and sends nothing anywhere: no MLflow run, checkpoint or child
process. It imports no Prefect or MLflow, so it runs on a machine that has only the compute and data
stack (numpy, numba, torch, zarr, pydantic). Then a workload with its own part (``Workload.bench_quality``: karman's
scores the test rollout and times the surrogate's step against the solver's on the same device) takes over; for another it scores the test split as
``train`` does (the workload trainer's ``finish``, its files kept in a temporary folder only).
"""

import logging
import statistics
import tempfile
import time
from pathlib import Path

from tasks.bench.specs import BenchQualitySpec
from tasks.common.config.settings import Settings
from tasks.common.specs import TrainSpec
from tasks.common.runtimes import loop
from tasks.common.runtimes.runtime_torch import TorchRuntime
from tasks.workloads import framework_module, get_workload, with_own_defaults

log = logging.getLogger("karman.bench")


class Validations:
    """The loop's recorder here: keeps each validation's scores against training time, sends nothing."""

    def __init__(self):
        self.rows: list[dict] = []

    def steps(self, rows) -> None:
        pass

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        scores = {k.removeprefix("val_"): round(v, 4) for k, v in metrics.items() if k.startswith("val_")}
        if scores:
            self.rows.append({"train_s": round(metrics["train_time_s"], 2), "epoch": epoch, **scores})


class KeptArtifacts:
    """What a workload trainer's ``finish`` logs, kept where it was written (a temporary folder here): the paths only."""

    def __init__(self):
        self.paths: list[str] = []

    def log_artifact(self, path, artifact_path: str | None = None) -> None:
        self.paths.append(str(path))


def bench_quality(bench: BenchQualitySpec) -> dict:
    """Train ``bench``'s spec once per seed (seed, seed + 1, ...) and report time to the quality target
    and the final rollouts; every simulation of each extra dataset is rolled out too (same geometry)."""
    settings = Settings.from_env()
    spec, repeats = with_own_defaults(bench.train_spec()), bench.repeats  # what it left out, its workload's (dataset, batch, epochs)
    workload = get_workload(spec.workload)
    if bench.extra_dataset and not workload.bench_quality:  # the workload's own part rolls its models out on them
        raise ValueError(f"--extra-dataset rolls out trained models on more datasets; the {spec.workload} workload has no rollouts")
    folders = [settings.dataset_dir(name) for name in [spec.dataset, *bench.extra_dataset]]
    for folder in folders:
        if not (folder / "manifest.json").is_file():
            raise ValueError(f"no dataset at {folder} (no manifest.json); make one with python -m flows generate --workload {spec.workload} --dataset {folder.name}")
    if spec.time_budget is None and spec.epochs is None:
        raise ValueError("give a time budget or an epoch limit: without either the run has no end")
    if not workload.bench_quality:
        return _bench_workload(settings, spec, repeats)
    workload.check(settings, spec, spec.batch_sizes, 1)
    runtime = TorchRuntime(spec.device, spec.precision, spec.threads, data_parallel=False)
    return workload.bench_quality(settings, bench, spec, runtime, lambda run_spec: _trained(settings, run_spec, runtime), folders)


def _bench_workload(settings, spec: TrainSpec, repeats: int) -> dict:
    """A workload without a bench-quality part of its own: train once per seed until its target or budget, then its test split's scores."""
    workload = get_workload(spec.workload)
    workload.check(settings, spec, spec.batch_sizes, 1)
    runtime = TorchRuntime(spec.device, spec.precision, spec.threads, data_parallel=False)
    runs = []
    for i in range(repeats):
        run_spec = spec.model_copy(update={"seed": spec.seed + i})
        _, trainer, summary, validations, train_s = _trained(settings, run_spec, runtime)
        with tempfile.TemporaryDirectory() as folder:
            test = trainer.finish(Path(folder), KeptArtifacts(), settings)
        runs.append({"seed": run_spec.seed, "epochs": summary.epochs, "steps": summary.steps, "train_s": train_s, "stopped_by": summary.ended_by,
                     "samples_per_s": summary.samples_seen / train_s, "s_per_epoch": train_s / max(summary.epochs, 1),
                     "final_losses": summary.final_losses, "time_to_target_s": summary.time_to_target_s,
                     "epochs_to_target": summary.epochs_to_target, "validations": validations.rows, "test": test})
    reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
    facts = workload.dataset_info(settings, spec.dataset)[1]  # the dataset's own account: har's may be real or synthetic
    return {"workload": spec.workload, "synthetic": facts.get("synthetic", workload.synthetic), **({"data": facts["data"]} if "data" in facts else {}), "device": runtime.description, "batch_size": spec.batch_sizes[0],
            "time_budget_s": spec.time_budget, "epoch_limit": spec.epochs, "seeds": [r["seed"] for r in runs],
            "runs_reaching_target": len(reached), "time_to_target_median_s": statistics.median(reached) if reached else None,
            "samples_per_s_median": statistics.median(r["samples_per_s"] for r in runs), "runs": runs}


def _trained(settings, spec: TrainSpec, runtime: TorchRuntime) -> tuple:
    """The workload's torch trainer for ``spec``, trained through the one loop: (data, trainer, loop summary,
    validations, seconds)."""
    workload = get_workload(spec.workload)
    data = workload.prepare(settings, spec)
    trainer = framework_module(workload, "torch").build(data, spec, spec.batch_sizes[0], runtime)
    validations = Validations()
    t0 = time.perf_counter()
    summary = loop.train(trainer, runtime, validations, spec, spec.batch_sizes[0], None, log, announce=False)
    return data, trainer, summary, validations, time.perf_counter() - t0
