"""The benchmark's plan: each workload's cells, datasets and deployments, made once from its spec.

Each workload's cells, the dataset each trains on, the deployments its cells run on, and the benchmark run's
description. The benchmark flow (flows.pipeline) runs what this plans."""

import itertools
from dataclasses import dataclass

from tasks.common.specs import BenchmarkSpec, GenerateSpec, InferSpec, TrainOptions, TrainSpec


@dataclass
class WorkloadCells:
    """One workload's part of the benchmark matrix: the frameworks it has of those asked for, its batch sizes, dataset (and how it is
    made), epochs, swept sizes, repeats and the train section its cells take."""

    workload: object  # tasks.workloads.Workload
    frameworks: list[str]
    batch_sizes: list[int]
    dataset: str
    epochs: int
    sizes: list[dict]  # the network sizes swept (e.g. {"layers": 2, "units": 64}); [{}]: the workload's own
    repeats: int  # training runs (seeds) per cell: the benchmark's repeats, else the workload's run rules'
    generate: GenerateSpec  # the dataset its cells train on, as generate makes it
    train: TrainOptions  # the benchmark's train section (its cells take their workload's options from it)

    def train_cells(self, spec: BenchmarkSpec) -> int:
        return len(self.frameworks) * len(spec.devices) * len(self.batch_sizes) * len(self.sizes) * self.repeats


def benchmark_matrix(spec: BenchmarkSpec) -> list[WorkloadCells]:
    """Each workload's cells, with what the workload table says of them (the dataset, made with which generate fields; the
    train section as its cells take it); UserError for an unknown workload, or a framework no workload of the matrix has."""
    from tasks.common.config.errors import UserError
    from tasks.workloads import benchmark_dataset, get_workload, swept_sizes

    matrix = []
    for name in spec.workloads:
        workload = get_workload(name)
        if workload.swept:  # its own sweep: the section's shared settings and its own options
            dataset, generate = spec.generate.dataset, spec.generate.spec_of(name)
        else:  # its own dataset, made with the generate section's options of that workload
            dataset, fields = benchmark_dataset(workload, spec.generate)
            generate = GenerateSpec(workload=name, dataset=dataset, options=fields)
        train, sizes = spec.train, swept_sizes(workload, spec)
        own = spec.per_workload.get(name)  # a preset's sizes of this workload's cells, where they are not its own
        matrix.append(WorkloadCells(workload, [f for f in spec.frameworks if f in workload.frameworks],
                                    list(spec.batch_sizes or (own.batch_sizes if own else None) or workload.batch_sizes), dataset,
                                    (own.epochs if own else None) or spec.train.epochs or workload.epochs, sizes,
                                    spec.repeats or workload.rules.runs, generate, train))
    unused = [f for f in spec.frameworks if not any(f in m.frameworks for m in matrix)]
    if unused:
        raise UserError(f"framework(s) {', '.join(unused)}: no workload of the benchmark ({', '.join(spec.workloads)}) has a version in them; "
                        + "; ".join(f"{m.workload.name} runs in {', '.join(m.workload.frameworks)}" for m in matrix))
    return matrix


def deployment_for(kind: str, device: str, pools: dict[str, str]) -> str | None:
    """'<flow>/<pool>' of the deployment that runs ``kind`` cells on ``device``; None to run them here."""
    pool = pools.get(device)
    return None if pool in (None, "local") else f"{kind}/{pool}"


def check_deployments(spec: BenchmarkSpec, matrix: list[WorkloadCells]) -> None:
    """UserError naming every deployment the matrix needs that the Prefect API does not have."""
    from tasks.common.config.errors import UserError
    from tasks.common.process.prefect_api import missing

    swept = any(m.workload.swept for m in matrix)  # only a solver sweep runs on a generate deployment
    kinds = (("train", spec.devices), ("infer", spec.infer_devices), ("generate", [spec.generate.device] if swept else []))
    needed = sorted({d for kind, devices in kinds for device in devices if (d := deployment_for(kind, device, spec.pools))})
    if not needed:
        return
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():  # the temporary local API has no deployments
        raise UserError(f"deployment(s) {', '.join(needed)} not found: no Prefect server is configured (PREFECT_API_URL); "
                        "start one and deploy (infra/start-prefect-server.sh, prefect deploy --all), or map the device to 'local' in pools")
    absent = missing(needed, lambda client, name: client.read_deployment_by_name(name))
    if absent:
        raise UserError(f"deployment(s) {', '.join(absent)} not found on the Prefect API; deploy them (prefect deploy --all) "
                        "or map the device to 'local' in pools")


def benchmark_description(spec: BenchmarkSpec, matrix: list[WorkloadCells], rollout_cells: list[tuple[str, str, int]]) -> str:
    """The benchmark run's description: what each workload trains where, what is rolled out, and how cells are reused."""
    budget = f"{spec.train.time_budget:g} s" if spec.train.time_budget else None
    parts = []
    for m in matrix:
        epochs = budget or f"{m.epochs} epochs"
        parts.append(f"{m.workload.title} ({'/'.join(m.frameworks)}) trained on {', '.join(spec.devices)} at global batch sizes "
                     f"{', '.join(map(str, m.batch_sizes))} ({m.repeats} seed(s) each, {epochs}) on dataset `{m.dataset}`"
                     + (f", data {m.workload.data}" if m.workload.synthetic else ""))
    rollouts = "".join(f" Each framework's first trained {m.workload.title} is rolled out {spec.infer.steps} steps "
                       f"({', '.join(f'{mode} x{w}' for _, mode, w in rollout_cells)}) on {', '.join(spec.infer_devices)}."
                       for m in matrix if m.workload.rollouts)
    return (f"Benchmark `{spec.aggregate.name}`: " + "; ".join(parts) + "." + rollouts +
            " New cells are child runs; cells that finished in an earlier benchmark are reused (runs.json lists every run the report covers). "
            "The report compares rows only within one setting.")


@dataclass
class Job:
    """One cell to run: its kind (train, infer), its spec (the cell key set once its dataset's digest is known), what the
    cell list shows of it, and where it runs (the deployment, or None here; the lane: its pool, or None)."""

    kind: str
    spec: object  # TrainSpec or InferSpec
    shown: dict
    deployment: str | None
    lane: str | None


@dataclass
class WorkloadPlan:
    """One workload's part of the plan: its cells, the dataset they train on and where it is made, its training jobs, and
    (for a workload with rollouts) the rollout jobs each framework's first trained model gets."""

    cells: WorkloadCells
    generate: GenerateSpec
    generate_deployment: str | None
    train: list[Job]
    rollouts: list[Job]  # their spec's model_run is set to the trained model's run id


@dataclass
class BenchmarkPlan:
    """The whole benchmark, planned once from its spec before anything runs."""

    name: str
    workloads: list[WorkloadPlan]
    total: int  # cells, the rollouts counted for every framework of a workload with rollouts
    description: str
    params: dict  # the benchmark run's MLflow params: the spec
    devices: list[str]
    aggregate: object  # AggregateSpec
    skipped: dict[str, list[str]]  # workload -> the frameworks asked for that it has no version in


def train_cell(train: TrainOptions, device: str, batch_size: int, seed: int, framework: str, workload: str, dataset: str | None = None,
               epochs: int | None = None, size: dict | None = None) -> TrainSpec:
    """The training spec of a cell: the benchmark's train section ``train`` with the cell's device, batch size, seed,
    framework, workload and its dataset, the workload's options from the section with its network ``size`` over them and,
    where given, the epoch limit of the workload's cells (the strategy is kept for a framework that has it, else auto)."""
    from tasks.common.config.frameworks import FRAMEWORKS

    own = train.options[workload].model_dump(exclude_unset=True) if workload in train.options else {}
    values = {"device": device, "batch_sizes": [batch_size], "seed": seed, "framework": framework, "strategy": FRAMEWORKS[framework].strategy_of(train.strategy),
              "workload": workload, "dataset": dataset or train.dataset, **({"epochs": epochs} if epochs is not None else {}),
              "options": own | (size or {})}
    return TrainSpec(**(train.model_dump(exclude={"options"}) | values))


def infer_cell(infer: InferSpec, device: str, mode: str, workers: int, model_run: str = "latest") -> InferSpec:
    """The rollout spec of a cell (device, mode, workers) from the benchmark's infer section, for the trained model ``model_run``."""
    return InferSpec(**(infer.model_dump() | {"model_run": model_run, "device": device, "mode": mode, "workers": workers}))


def _job(kind: str, spec, shown: dict, pools: dict[str, str]) -> Job:
    deployment = deployment_for(kind, spec.device, pools)
    return Job(kind, spec, shown, deployment, pools.get(spec.device) if deployment else None)


def plan_benchmark(spec: BenchmarkSpec) -> BenchmarkPlan:
    """Every cell of the benchmark with the dataset it trains on and where it runs; UserError for what cannot run
    (an unknown workload, a framework no workload has, a deployment the Prefect API lacks)."""
    matrix = benchmark_matrix(spec)
    rollout_cells = spec.infer_cells()  # (device, mode, workers)
    check_deployments(spec, matrix)
    plans = []
    for m in matrix:
        name = m.workload.name
        train = []
        for framework, device, batch, size in itertools.product(m.frameworks, spec.devices, m.batch_sizes, m.sizes):
            for seed in range(spec.train.seed, spec.train.seed + m.repeats):
                cell = train_cell(m.train, device, batch, seed, framework, name, m.dataset, None if spec.train.time_budget else m.epochs, size)
                train.append(_job("train", cell, {"workload": name, "framework": framework, "device": device, "batch_size": batch, "seed": seed},
                                  spec.pools))
        rollouts = [_job("infer", infer_cell(spec.infer, device, mode, workers), {"framework": framework, "device": device, "mode": mode,
                                                                             "workers": workers}, spec.pools)
                    for framework in m.frameworks for device, mode, workers in rollout_cells] if m.workload.rollouts else []
        plans.append(WorkloadPlan(m, m.generate, deployment_for("generate", m.generate.device, spec.pools) if m.workload.swept else None,
                                  train, rollouts))
    return BenchmarkPlan(spec.aggregate.name, plans, sum(len(p.train) + len(p.rollouts) for p in plans),
                         benchmark_description(spec, matrix, rollout_cells), spec.model_dump(), list(spec.devices), spec.aggregate,
                         {m.workload.name: [f for f in spec.frameworks if f not in m.frameworks] for m in matrix})
