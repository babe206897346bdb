"""bench-frameworks: each framework's training of a workload against that framework's idiomatic reference (samples/s, ours / reference), in one run; imports no Prefect or MLflow.

The parent imports no framework: it checks the request and the stored dataset, then runs one child per
framework (``frameworks_job``), one after the other so that they never share the cores. A child holds both
sides in one process, with the same threads and heap: our trainer (the workload's framework module, built as
``train`` builds it) trained through the one loop (tasks.common.runtimes.loop) exactly as ``train`` and
``bench-quality`` run it, and the reference (the workload's ``references/<framework>.py``, found through the
workload table: tasks.workloads.reference_module), the same network and optimiser written as the framework's own
documentation teaches. Both start from the workload's initial weights, and the child first checks that they give
the same loss on the same batch. Then timed blocks of ``steps`` optimiser steps alternate
between the sides (which goes first alternating too), after one untimed block each (tracing, compilation,
allocator warm-up); each side reports the median block. With ``--profile``, one more block of each side runs
under the framework's own profiler (tasks.bench.profiles): its ops with the most self time.

Ours is timed as the loop times an epoch (``epoch_time_s``: its batches in the epoch's order, moved to the device,
each step with its losses read back and checked); the reference from its shuffle to its last step's end (Keras:
``fit``'s epoch, from its start to its end).
"""

import logging
import os
import statistics
from dataclasses import dataclass

from tasks.bench.specs import BenchFrameworksSpec
from tasks.common.config.errors import RunFailed, UserError

log = logging.getLogger("karman.bench")
BODY = "tasks.bench.frameworks:frameworks_job"
KIND = "bench"
LOSS_TOLERANCE = 1e-4  # the first batch's loss, ours against the reference's, from the same weights (float32 in both)


@dataclass(frozen=True)
class BenchPlan:
    """What a framework's ``open_runtime`` reads of a training plan: the spec, one device, the strategy and threads."""

    spec: object  # tasks.common.specs.TrainSpec
    framework: str
    strategy: str
    threads: int | None
    world: int = 1


class EpochMetrics:
    """The loop's recorder here: keeps the last epoch's metrics, sends nothing."""

    def __init__(self):
        self.last: dict[str, float] = {}

    def steps(self, rows) -> None:
        pass

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.last = metrics


def train_spec(spec: BenchFrameworksSpec, framework: str, batch_size: int):
    """The training spec our trainer is built and looped with: one epoch, no validation."""
    from tasks.common.specs import TrainSpec

    given = {"dataset": spec.dataset} if spec.dataset else {}
    return TrainSpec(workload=spec.workload, framework=framework, device=spec.device, batch_sizes=[batch_size], epochs=1, validate_every=0,
                     seed=spec.seed, threads=spec.threads, **given)


def frameworks_job(job: dict) -> dict:
    """Child side: our trainer and the reference of one framework in this process, checked for the same first loss,
    then timed block by block."""
    from tasks.common.config.settings import Settings
    from tasks.common.specs import TrainSpec
    from tasks.common.runtimes import loop
    from tasks.common.config.frameworks import FRAMEWORKS, open_runtime
    from tasks.workloads import framework_module, get_workload, reference_module

    spec = TrainSpec.model_validate(job["spec"])
    framework, batch_size, repeats = spec.framework, spec.batch_sizes[0], job["repeats"]
    runtime = open_runtime(BenchPlan(spec, framework, FRAMEWORKS[framework].resolve_strategy(spec, 1), job["threads"]))
    workload = get_workload(spec.workload)
    data = workload.prepare(Settings.from_env(), spec)
    trainer = framework_module(workload, framework).build(data, spec, batch_size, runtime)
    per_epoch = trainer.samples // batch_size
    steps = job["steps"] or per_epoch
    if steps > per_epoch:
        raise UserError(f"--steps {steps}: an epoch of dataset {spec.dataset!r} has {per_epoch} steps at batch {batch_size}; use at most {per_epoch}")
    module = reference_module(workload, framework)
    x, y = module.arrays(data)
    reference = module.Reference(spec, module.ours_weights(trainer), x, y, batch_size)
    first = {"ours": module.ours_loss(trainer, x[:batch_size], y[:batch_size]), "reference": float(reference.loss(x[:batch_size], y[:batch_size]))}
    if not abs(first["ours"] - first["reference"]) <= LOSS_TOLERANCE:
        raise RunFailed(f"the {framework} reference's loss on the first batch, {first['reference']:.6g}, is not ours, {first['ours']:.6g}, "
                           "from the same weights: it is not the same network")
    looped = spec.model_copy(update={"max_steps": steps})
    recorder = EpochMetrics()

    def ours() -> float:
        loop.train(trainer, runtime, recorder, looped, batch_size, None, log, announce=False)
        return recorder.last["epoch_time_s"]

    sides = {"ours": ours, "reference": lambda: reference.train(steps)}
    warmup = {key: run() for key, run in sides.items()}
    times: dict[str, list[float]] = {key: [] for key in sides}
    for r in range(repeats):
        for key in (("ours", "reference") if r % 2 == 0 else ("reference", "ours")):
            times[key].append(sides[key]())
    profiles = {}
    if job["profile"]:
        from tasks.bench.profiles import profile_block

        profiles = {key: profile_block(framework, run, steps) for key, run in sides.items()}
    return {"framework": framework, "version": runtime.version, "device_name": runtime.description, "threads": runtime.threads,
            "train_samples": trainer.samples, "steps": steps, "reference": reference.words, "first_loss": first,
            "warmup_s": warmup, "seconds": times, "profile": profiles}


def _check_dataset(spec: BenchFrameworksSpec, batch_size: int) -> tuple[str, dict]:
    """The dataset's name and facts (its data: real or synthetic); UserError where it is not stored, or the batch does not fit it."""
    from tasks.common.config.settings import Settings
    from tasks.workloads import get_workload

    settings, workload = Settings.from_env(), get_workload(spec.workload)
    dataset = spec.dataset or workload.dataset or train_spec(spec, "torch", batch_size).dataset  # a swept workload names none: TrainSpec's default
    if not (settings.dataset_dir(dataset) / "manifest.json").is_file():
        raise UserError(f"no {spec.workload} dataset {dataset!r} in {settings.data_root}; "
                        f"make one with python -m flows generate --workload {spec.workload} --dataset {dataset}")
    tspec = train_spec(spec, "torch", batch_size).model_copy(update={"dataset": dataset})
    workload.check(settings, tspec, [batch_size], 1)
    facts = workload.dataset_info(settings, dataset)[1]
    return dataset, {"synthetic": facts.get("synthetic", workload.synthetic), **({"data": facts["data"]} if "data" in facts else {})}


def bench_frameworks(spec: BenchFrameworksSpec) -> dict:
    """Every framework of the spec, ours against its reference, each in its own child; the summary with per framework
    both samples/s (median blocks), their ratio (ours / reference) and each repeat's."""
    from models.host import cpu_cores
    from tasks.common.measures.ceiling import cpu_name, this_cpu
    from tasks.common.process.launch import device_env, run_child
    from tasks.workloads import check_framework, check_reference, get_workload

    workload = get_workload(spec.workload)
    for fw in spec.frameworks:
        check_framework(workload, fw)
        check_reference(workload, fw)
    if spec.threads is not None and spec.threads > cpu_cores():
        raise UserError(f"--threads {spec.threads}: this host has {cpu_cores()} CPU cores")
    batch_size = spec.batch_size or workload.batch_sizes[0]
    dataset, data = _check_dataset(spec, batch_size)
    threads = (spec.threads or cpu_cores()) if spec.device == "cpu" else None
    load_before = os.getloadavg()[0]
    rows = {}
    for fw in spec.frameworks:
        env = device_env(spec.device, framework=fw) | ({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {})
        job = {"spec": train_spec(spec, fw, batch_size).model_copy(update={"dataset": dataset}).model_dump(mode="json"),
               "steps": spec.steps, "repeats": spec.repeats, "threads": threads, "profile": spec.profile}
        child = run_child(KIND, BODY, job, log, env=env, framework=fw)
        rows[fw] = _row(child, batch_size)
        log.info("%s %s: ours %.0f samples/s, reference %.0f, ours / reference %.3f", spec.workload, fw,
                 rows[fw]["samples_per_s"], rows[fw]["reference_samples_per_s"], rows[fw]["ratio"])
    cpu = this_cpu()
    return {"workload": spec.workload, "dataset": dataset, **data, "device": spec.device, "cpu_name": cpu_name(cpu) if spec.device == "cpu" else None,
            "cores": cpu_cores(), "batch_size": batch_size, "repeats": spec.repeats, "seed": spec.seed,
            # the host's 1-minute load average before and after: above its core count, other work shared the cores
            "load_average": {"before": load_before, "after": os.getloadavg()[0]}, "frameworks": rows}


def _row(child: dict, batch_size: int) -> dict:
    """One framework: ours and the reference's samples/s (median blocks), the ratio, each repeat's, and the first loss of each."""
    samples = child["steps"] * batch_size

    def rate(key: str) -> float:
        return samples / statistics.median(child["seconds"][key])

    ours, ref = child["seconds"]["ours"], child["seconds"]["reference"]
    return {"samples_per_s": rate("ours"), "reference_samples_per_s": rate("reference"), "ratio": rate("ours") / rate("reference"),
            "samples_per_s_runs": [round(samples / s, 2) for s in ours], "reference_samples_per_s_runs": [round(samples / s, 2) for s in ref],
            "ratio_runs": [round(r / o, 4) for o, r in zip(ours, ref)],
            # each repeat's two blocks ran back to back: the median of their ratios is the one a drifting host moves least
            "ratio_of_pairs_median": statistics.median(r / o for o, r in zip(ours, ref)), "steps": child["steps"], "train_samples": child["train_samples"],
            "first_loss": child["first_loss"], "reference": child["reference"], "version": child["version"],
            "device_name": child["device_name"], "threads": child["threads"],
            "warmup_s": {k: round(v, 4) for k, v in child["warmup_s"].items()}, **({"profile": child["profile"]} if child["profile"] else {})}
