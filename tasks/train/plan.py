"""A training request turned into one checked TrainPlan, in the flow process (no framework imported); the training job receives it as JSON."""

import os

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.host import cpu_cores
from tasks.common.config import plans
from tasks.common.runtimes import probe
from tasks.common.config.errors import UserError
from tasks.common.process.launch import device_env, run_child
from tasks.common.config.settings import Settings
from tasks.common.specs import TrainSpec
from tasks.common.stores.store import writer_lock
from tasks.common.tracking.runs import training_run
from tasks.common.runtimes.checkpoint import resumable
from tasks.common.config.frameworks import framework
from tasks.workloads import check_framework, get_workload

JOB_FILE = "job.json"  # the TrainJob the run's child received, kept with its checkpoint for --resume


class TrainPlan(BaseModel):
    """What a training request resolves to, checked once: the configuration (a resumed run's own),
    the batch sizes, and how the run spreads over this host."""

    spec: TrainSpec = Field(description="The configuration; for a resumed run, the one it was started with")
    batch_sizes: list[int] = Field(description="Global batch sizes, one run each; each splits evenly over the world and fits the training pairs")
    world: int = Field(description="Devices the batch is spread over")
    procs: int = Field(description="Processes launched on each host: one per device for cpu and cuda DDP, one for xla SPMD")
    hosts: int = Field(default=1, description="Hosts of the SLURM allocation the processes spread over (tasks.common.process.hosts)")
    threads: int | None = Field(description="CPU threads per process (cpu); None elsewhere")
    resume: str | None = Field(description="The run being resumed, or None")
    framework: str = Field(default="torch", description="Selects the training job's framework")
    strategy: str = Field(default="auto", description="tensorflow's resolved distribution strategy (default, mirrored, multiworker, tpu); auto for torch")

    def child_env(self) -> dict[str, str]:
        """The training child's environment, set from the plan, never inherited (Dask's LocalCluster sets
        OMP_NUM_THREADS=1 in the process that starts it)."""
        env = device_env(self.spec.device, self.world, self.framework)
        if self.threads:
            env |= {"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}  # torch reads both; MKL's wins
        return env


class TrainJob(BaseModel):
    """What the training child receives: one batch size of a plan, the run it reports to, where things are stored."""

    model_config = ConfigDict(extra="ignore")  # the launcher adds the body and framework it ran

    plan: TrainPlan
    settings: Settings
    run_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    batch_size: int = Field(gt=0)


def run_strategy(spec: TrainSpec, world: int) -> str:
    """The strategy a run of ``world`` devices uses (the framework table's: tensorflow's auto is tpu on xla, default
    for one device, mirrored for more, multiworker over hosts; auto for the frameworks that have none to choose)."""
    return framework(spec.framework).resolve_strategy(spec, world)


def plan_world(spec: TrainSpec, probed: dict | None) -> tuple[int, int]:
    """(world size, processes to launch on each host) for the spec; UserError if a host lacks them (the hosts
    of a multi-host run are taken to be alike: this one stands for each). ``probed`` is the device probe's answer (None for cpu)."""
    fw = framework(spec.framework)
    if spec.hosts > 1:
        per_host = spec.model_copy(update={"hosts": 1, "world_size": spec.world_size // spec.hosts, "strategy": run_strategy(spec, spec.world_size)})
        return spec.world_size, plan_world(per_host, probed)[1]
    if spec.device == "cpu":
        world = spec.world_size or 1
        cores = cpu_cores()
        if world > cores:
            raise UserError(f"world size {world} exceeds the {cores} CPU cores of this host")
        return world, fw.procs(spec.device, world, run_strategy(spec, world))
    available = int(probed["world_size"]) if probed else 1
    world = spec.world_size or available
    if world > available:
        raise UserError(f"world size {world} exceeds the {available} {spec.device} devices of this host ({probed['device']})")
    if spec.device == "xla" and world != available:
        raise UserError(f"xla trains over all {available} devices of the host with SPMD; leave out --world-size or set it to {available}")
    return world, fw.procs(spec.device, world, run_strategy(spec, world))


def check_allocation(hosts: int, env: dict[str, str]) -> None:
    """UserError unless this process runs inside a SLURM allocation of at least ``hosts`` nodes (where srun can start the training)."""
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    if "SLURM_JOB_ID" not in env or not (nodes or "").isdigit():
        raise UserError(f"--hosts {hosts} runs inside a SLURM allocation of {hosts} nodes (infra/slurm-train.sbatch); this process is in none")
    if int(nodes) < hosts:
        raise UserError(f"--hosts {hosts} exceeds the {nodes} nodes of SLURM job {env['SLURM_JOB_ID']}")


def check_training_input(settings: Settings, spec: TrainSpec, batch_sizes: list[int], world: int, memory: int | None = None) -> None:
    """What the workload can refuse before any run starts (it reads the dataset's metadata only): the
    batches against the devices and the data, and the estimated memory of a step against ``memory``."""
    workload = get_workload(spec.workload)
    if world > 1 and spec.framework in workload.one_device:
        raise UserError(f"the {workload.name} workload trains {spec.framework} on one device; leave out --world-size (asked for {world})")
    workload.check(settings, spec, batch_sizes, world, memory)


def device_memory(spec: TrainSpec, probed: dict | None, procs: int) -> int | None:
    """Bytes of memory one training process may use: the host's RAM shared by its processes (cpu), a
    device's own memory (cuda, from the probe), unknown elsewhere."""
    if spec.device == "cpu":
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // procs
    return int(probed["memory_bytes"]) if probed and probed.get("memory_bytes") else None


def resume_plan(settings: Settings, spec: TrainSpec) -> tuple[TrainSpec, int]:
    """The stored configuration and batch size of the run ``spec.resume``; UserError if it cannot be
    resumed (unknown, finished, not a training run, no job file, no sound checkpoint) or the spec
    contradicts it."""
    run_id = spec.resume
    run = training_run(settings, run_id)
    if run.info.status == "FINISHED":
        raise UserError(f"run {run_id} already finished; there is nothing to resume")
    job_file = settings.run_dir(run_id) / JOB_FILE
    if not job_file.is_file():
        raise UserError(f"run {run_id} has no {JOB_FILE} under {job_file.parent}; it cannot be resumed")
    with writer_lock(settings.run_dir(run_id), f"run {run_id}"):  # refused here if another process trains it
        pass
    try:
        stored = TrainJob.model_validate_json(job_file.read_text())
    except ValidationError:
        raise UserError(f"run {run_id} was started by an earlier version ({job_file} is not a training job of this one); "
                        "its checkpoint cannot be resumed: start the run afresh") from None
    stored_spec = stored.plan.spec
    kind = framework(stored_spec.framework)
    resumable(settings.run_dir(run_id) / kind.checkpoint, kind.checkpoint_format)  # a whole one of the two kept, or refused here
    given = [(name, getattr(spec, name), getattr(stored_spec, name)) for name in sorted(spec.model_fields_set - {"resume", "options"})]
    given += [(name, getattr(spec.options, name), getattr(stored_spec.options, name, None)) for name in sorted(spec.options.model_fields_set)]
    for name, mine, theirs in given:  # what the request gave, its workload's options one by one
        if mine != theirs:
            raise UserError(f"--{name.replace('_', '-')} {mine} differs from the run being resumed ({theirs}); leave it out to use the run's value")
    return stored_spec, stored.batch_size


def plan_training(settings: Settings, spec: TrainSpec, log) -> TrainPlan:
    """Every check of a training request, once, before any run starts: the run to resume, the dataset,
    the devices (a probe child for cuda and xla), the batch sizes against the devices and the data.
    A plan the CLI made for the same spec is taken instead. UserError names the value and what is allowed."""
    handed = plans.take("train", spec)
    if handed is not None:
        return handed
    resume = spec.resume
    batch_sizes = list(spec.batch_sizes)
    if resume:
        spec, batch = resume_plan(settings, spec)
        batch_sizes = [batch]
    check_framework(get_workload(spec.workload), spec.framework)
    if spec.threads and spec.threads > cpu_cores():
        raise UserError(f"--threads {spec.threads} exceeds the {cpu_cores()} CPU cores of this host; use at most {cpu_cores()}")
    get_workload(spec.workload).dataset_info(settings, spec.dataset)  # UserError for a dataset that is not there
    probed = None
    if spec.device != "cpu":
        probed = run_child("probe", probe.BODY, {"device": spec.device}, log, env=device_env(spec.device, spec.world_size, spec.framework),
                           framework=spec.framework)
    if spec.hosts > 1:
        check_allocation(spec.hosts, dict(os.environ))
    world, procs = plan_world(spec, probed)
    check_training_input(settings, spec, batch_sizes, world, device_memory(spec, probed, procs))
    threads = (spec.threads or max(1, cpu_cores() // procs)) if spec.device == "cpu" else spec.threads
    strategy = run_strategy(spec, world)
    return TrainPlan(spec=spec, batch_sizes=batch_sizes, world=world, procs=procs, hosts=spec.hosts, threads=threads, resume=resume,
                     framework=spec.framework, strategy=strategy)
