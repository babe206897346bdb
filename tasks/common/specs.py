"""Typed, validated configuration of each unit of work: the flows' parameters, the CLI's options, the plans' input.

Flows take these as parameters, so the Prefect UI's run form, the CLI's options and the child processes all read one validated object.
"""

import itertools
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, StringConstraints, TypeAdapter,
                      field_validator, model_validator)
from pydantic.json_schema import SkipJsonSchema

from models.host import DeviceKind as Device
from models.karman.tiling import DEFAULT_HALO
from tasks.common.config.errors import UserError
from tasks.common.config.frameworks import FRAMEWORKS
from tasks.common.config.options import AnyOptions, ForeignOptions, Spec, WorkloadOptions
from tasks.common.config.workload_table import DEFAULT_WORKLOAD

DEFAULT_EPOCHS = 3  # a training run's epoch limit when it gives neither epochs nor a time budget

# A dataset's or a report's name: a folder of its own under the data root (no separators, no leading dot).
FOLDER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

DatasetName = Field(
    default="karman-demo",
    pattern=FOLDER_NAME,
    description="Dataset name: a folder in the data root's datasets folder; left out, the workload's own (karman's demo sweep; the others their names; --workload NAME --help shows it)",
)


def once_each(values: list, what: str) -> list:
    """``values`` unchanged; ValueError naming the repeated ones if any value appears twice."""
    repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
    if repeated:
        raise ValueError(f"repeats {', '.join(map(str, repeated))}; each {what} must appear once")
    return values


WORKLOAD_NAME = r"^[a-z][a-z0-9_-]{0,31}$"  # a workload's name in the workload table

# A benchmark cell's key: the benchmark flow sets it for its cells; it is not a user's choice.
CellKey = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
CELL_DESCRIPTION = "Benchmark cell key, set by the benchmark flow: tags the MLflow run so a rerun can skip it"

# Run forms (Prefect's UI) render a spec's schema ``properties``: ``cell`` is left out of them with
# SkipJsonSchema, as the flows' ``parent_run`` is. A spec forbids unknown fields, so its schema says
# ``additionalProperties: false``, and Prefect's server validates a deployment's runs against the stored
# schema: the specs that carry ``cell`` declare it again under ``patternProperties``, which the form does
# not render and the server still applies, so it takes a cell's key and checks it.
CELL_IN_SCHEMA = ConfigDict(json_schema_extra={"patternProperties": {"^cell$": TypeAdapter(CellKey | None).json_schema()}})


def with_options(values: dict, shared: set[str], kind: str = "train") -> dict:
    """A training spec's ``values`` with its workload's options gathered into ``options``: given there, or beside the
    shared fields (as the command line gives them, and as specs, records and deployments written when one flat spec held
    every workload's options have them). Another workload's option at its default there (None, or that workload's
    default) is dropped; set, it is refused in one line naming whose it is and the workload's own options."""
    from tasks.common.config.workload_table import option_owners, options_model

    values = dict(values)
    name = values.get("workload", DEFAULT_WORKLOAD)
    try:
        model = options_model(name, kind) or WorkloadOptions  # a workload without options of this kind takes none
    except UserError:  # a workload this process's table does not know: a record of it reads back as it was
        model = ForeignOptions  # (a request that names it is refused where its workload is looked up)
    given = values.pop("options", None)
    own = dict(given.model_dump(exclude_unset=True) if isinstance(given, BaseModel) else given or {})
    flat = {k: values.pop(k) for k in list(values) if k not in shared}
    owners = option_owners(kind) if flat else {}
    for option, value in flat.items():
        if option in model.model_fields:
            own[option] = value  # beside the shared fields (the command line's flags) over ``options`` (a spec file's)
        elif option in owners and all(_as_held(options_model(o, kind), option, value) for o in owners[option]):
            continue  # another workload's option as the one flat spec held it: at its default
        elif option in owners:
            flag = lambda n: "--" + n.replace("_", "-")  # noqa: E731
            mine = list(model.model_fields)
            raise ValueError(f"workload {name} takes no {flag(option)} ({' and '.join(owners[option])}'s option); "
                             + (f"its own options are {', '.join(map(flag, mine))}" if mine else "it has no options of its own"))
        else:
            values[option] = value  # not an option of any workload: the spec refuses it as an unknown field
    values["options"] = model.model_validate(own)
    return values


class GenerateSpec(Spec):
    """A workload's dataset, written into the store: the settings every workload's generate shares, and its own ``options``
    (karman's solver sweep, calo's showers, har's source)."""

    options_kind: ClassVar[str] = "generate"  # which of a workload's options models its ``options`` are (its options.py's GENERATE)

    workload: str = Field(default=DEFAULT_WORKLOAD, pattern=WORKLOAD_NAME, description="Workload whose dataset to write, by name from the workload table: karman (a solver sweep), digits (5,000 real MNIST digits), har (activity-sensor windows: UCI HAPT's real recordings, or synthetic ones) or calo (synthetic calorimeter showers); each has options of its own (--workload NAME --help shows them)")
    dataset: str = DatasetName
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of what the dataset draws (karman: the initial perturbation; calo: the showers)")
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="cpu: each part on a Dask worker; cuda: a karman sweep's simulations batched on a GPU, one fused kernel launch per step for all of them, in a child process")
    workers: PositiveInt = Field(default=2, le=1024, description="Dask workers of the local cluster (one thread each; cpu)")
    scheduler: str | None = Field(default=None, description="Address of an existing Dask scheduler; None starts a LocalCluster")
    overwrite: bool = Field(default=False, description="Delete an existing dataset of this name first")
    options: AnyOptions = Field(default_factory=WorkloadOptions, description="The workload's own options (its folder's options.py): --workload NAME --help lists them")

    @model_validator(mode="before")
    @classmethod
    def _gather_options(cls, values: Any) -> Any:
        return with_options(values, set(cls.model_fields), "generate") if isinstance(values, dict) else values

    @model_validator(mode="after")
    def _options_hold(self) -> "GenerateSpec":
        self.options.check(self)  # the workload's own checks across its options and the shared ones
        return self


def _as_held(model: type[WorkloadOptions], option: str, value: Any) -> bool:
    """Whether ``value`` is what a flat spec of another workload held for ``model``'s ``option``: None, its default, or the
    value it was keyed at (karman's frame stride resolved to 1)."""
    return value is None or value == model.model_fields[option].default or value == model.key_padding().get(option, None)


class TrainSpec(Spec):
    """One training run of a workload: the settings every workload's runs share, and its own ``options``."""

    model_config = CELL_IN_SCHEMA
    options_kind: ClassVar[str] = "train"  # which of a workload's options models its ``options`` are (its options.py's TRAIN)

    workload: str = Field(default=DEFAULT_WORKLOAD, pattern=WORKLOAD_NAME, description="Workload, by name from the workload table: karman (the Pix2Pix surrogate of a vortex street), digits (a CNN on 5,000 real MNIST digits), har (bidirectional LSTMs on activity-sensor windows) or calo (a 3-D GAN of calorimeter showers, synthetic data); each has options of its own (--workload NAME --help shows them)")
    dataset: str = DatasetName
    framework: Literal["torch", "tensorflow", "jax"] = Field(default="torch", description="torch (PyTorch), tensorflow (Keras 3 under a tf.distribute strategy) or jax (one process, data-parallel over its devices): the same networks, recipe, data and metrics; a workload runs in the frameworks it has")
    device: Device = Field(default="cpu", description="cpu, cuda (all visible GPUs) or xla (TPU cores: torch_xla, or TPUStrategy for tensorflow)")
    strategy: Literal["auto", "default", "mirrored", "multiworker", "tpu"] = Field(default="auto", description="tensorflow's distribution strategy: default (one device), mirrored (the world's devices in one process; on cpu, logical CPUs), multiworker (one process per device on 127.0.0.1), tpu (a TPU host); auto = default for one device, mirrored for more, tpu for xla. torch takes auto: DDP processes on cpu and cuda, SPMD on xla")
    batch_sizes: list[PositiveInt] = Field(default=[8], min_length=1, description="Global batch sizes; several make a sweep: one run each, children of one parent run; left out, the workload's own first (--workload NAME --help shows it)")
    world_size: PositiveInt | None = Field(default=None, description="Devices to train on, data-parallel; None = every GPU or TPU core, 1 process on cpu (cpu > 1: DDP processes over gloo)")
    hosts: PositiveInt = Field(default=1, le=4096, description="Hosts of a SLURM allocation the world spreads over (torch: torchrun on each, a c10d rendezvous; tensorflow: multiworker, TF_CONFIG from SLURM's environment); the world size is the total, an equal share per host; > 1 runs inside the allocation (infra/slurm-train.sbatch)")
    epochs: PositiveInt | None = Field(default=None, le=100_000, description=f"Training epochs at most; None = {DEFAULT_EPOCHS}, or no limit with a time budget; left out, the workload's own (--workload NAME --help shows it)")
    time_budget: PositiveFloat | None = Field(default=None, le=30 * 86400, description="Wall-clock seconds of training (validation included): training stops at the end of the step that crosses it and saves the model of that moment")
    validate_every: int = Field(default=2, ge=0, description="Epochs between validations on the validation split, logged against training time (0 = none)")
    stop_at_target: bool = Field(default=False, description="End training at the validation that first reaches the quality target")
    precision: Literal["fp32", "bf16"] = Field(default="fp32", description="fp32, or bf16 autocast")
    compile: Literal["auto", "on", "off"] = Field(default="auto", description="torch.compile the networks (torch; auto = off: slower on CPU, and on a GPU its compilation costs more than it saves in short runs), or XLA-compile the step with jit_compile (tensorflow; auto = off)")
    max_steps: PositiveInt | None = Field(default=None, le=10**9, description="Stop after this many optimiser steps (smoke runs)")
    threads: PositiveInt | None = Field(default=None, le=4096, description="CPU threads of the framework, at most the host's cores; None = all cores")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of weights, split and shuffling")
    resume: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$", description="MLflow run id of an interrupted training run to continue from its last checkpoint (other fields are taken from that run)")
    cell: SkipJsonSchema[CellKey | None] = Field(default=None, description=CELL_DESCRIPTION)
    options: AnyOptions = Field(default_factory=WorkloadOptions, description="The workload's own options (its folder's options.py): --workload NAME --help lists them")

    @model_validator(mode="before")
    @classmethod
    def _gather_options(cls, values: Any) -> Any:
        return with_options(values, set(cls.model_fields)) if isinstance(values, dict) else values

    @field_validator("batch_sizes")
    @classmethod
    def _distinct(cls, values: list[int]) -> list[int]:
        return once_each(values, "batch size of a sweep")

    @model_validator(mode="after")
    def _options_hold(self) -> "TrainSpec":
        FRAMEWORKS[self.framework].check(self)  # its strategies, precisions and hosts
        if self.hosts > 1:
            if not self.world_size or self.world_size % self.hosts:
                raise ValueError(f"--hosts {self.hosts} needs --world-size, a multiple of {self.hosts} (the devices of all hosts)")
        self.options.check(self)  # the workload's own checks across its options and the shared ones
        return self

    @property
    def epoch_limit(self) -> int:
        """Epochs to run at most: the given number, else DEFAULT_EPOCHS, or (with a time budget) until the budget ends."""
        if self.epochs is not None:
            return self.epochs
        return 10**9 if self.time_budget is not None else DEFAULT_EPOCHS

    def progress(self, train_s: float, step: int, steps_per_epoch: int) -> float:
        """How far the run is, 0 to 1, for the learning-rate schedule: training time over the time
        budget or optimiser steps over the step limit (epochs, ``max_steps``), whichever is further."""
        from models.schedule import schedule_progress

        total = self.epoch_limit * steps_per_epoch
        return schedule_progress(train_s, step, self.time_budget, min(total, self.max_steps or total))

    def params(self) -> dict[str, Any]:
        """The spec as a run's MLflow params: the shared fields that are set, and the workload's own options that are."""
        shared = self.model_dump(mode="json", exclude={"options", "cell"})
        return {k: v for k, v in shared.items() if v is not None} | self.options.params()

    def key_fields(self) -> dict:
        """Its fields as a cell's key hashes them (tasks.common.tracking.cells.cell_key): the shared ones, its workload's options, and
        what the first workloads' cells held of the others' options (WorkloadOptions.key_padding), so that a cell keyed
        before options were a workload's own keeps its key."""
        from tasks.common.config.workload_table import padding_of_others

        return self.model_dump(mode="json", exclude={"cell", "options"}) | padding_of_others(self.workload) | self.options.key_fields()


class InferSpec(Spec):
    """An autoregressive rollout of a trained generator on a held-out simulation, full-frame or
    map-reduce tiled over several workers."""

    model_config = CELL_IN_SCHEMA
    cli_aliases: ClassVar[dict[str, tuple[str, ...]]] = {"model_run": ("--model",)}  # infer --model models:/NAME@champion

    model_run: str = Field(default="latest", description="MLflow run id of a training run, 'latest', or a registered model's URI "
                           "(models:/karman-surrogate@champion, models:/NAME/VERSION)")
    device: Device = Field(default="cpu", description="Device of the rollout")
    mode: Literal["full", "mapreduce"] = Field(default="full", description="full: the whole frame on one worker; mapreduce: tiles with a halo, grouped, mapped over the workers, blended back")
    workers: PositiveInt = Field(default=1, le=4096, description="Compute units: CPU cores (one thread each), GPUs, or XLA devices (1 or all); full mode uses 1")
    tile: list[PositiveInt] | None = Field(default=None, min_length=1, max_length=2, description="Tile side, or height,width; multiples of the U-Net's 2^depth; None = the model's training size")
    halo: int = Field(default=DEFAULT_HALO, ge=0, description="Pixels each tile reaches into its neighbours (the overlap is twice this)")
    group: PositiveInt | None = Field(default=None, description="Tiles per batch; None = tiles / workers, rounded up (one batch per worker and frame)")
    dataset: str | None = Field(default=None, pattern=FOLDER_NAME, description="Dataset of the reference simulation; None = the model's training dataset")
    steps: PositiveInt = Field(default=20, le=100_000, description="Rollout steps (each advances k frames)")
    simulation: str | None = Field(default=None, description="Simulation id; None = the model's first test simulation")
    start_frame: int = Field(default=0, ge=0, description="Reference frame the rollout starts from")
    threshold_u: PositiveFloat = Field(default=0.1, description="Relative L2 error of u that ends the rollout's useful horizon (horizon_u)")
    threshold_vorticity: PositiveFloat = Field(default=0.3, description="Relative L2 error of vorticity that ends the rollout's useful horizon (horizon_vorticity)")
    hold_inflow: bool = Field(default=False, description="Hold u and v of the inlet column at the first frame's values after every step (the inflow is steady), as u, v and p inside the obstacle are always held at zero")
    cell: SkipJsonSchema[CellKey | None] = Field(default=None, description=CELL_DESCRIPTION)

    @model_validator(mode="after")
    def _one_worker_for_full(self) -> "InferSpec":
        if self.mode == "full" and self.workers != 1:
            raise ValueError(f"full-frame runs on one worker, got workers={self.workers}; use mode mapreduce to spread a frame over workers")
        return self


class AggregateSpec(Spec):
    """Comparison tables, figures and a report over the experiment's runs."""

    name: str = Field(default="latest", pattern=FOLDER_NAME, description="Report folder name in the data root's reports folder")
    runs: str = Field(default="latest", pattern=r"^(latest|all|[0-9a-f]{32})$", description="Which runs the report covers: latest (the newest benchmark or demo run's), the MLflow run id of a benchmark or demo run, or all (every run of the experiment)")


class DemoSpec(Spec):
    """The quick CPU pipeline: a small sweep, a narrow Pix2Pix, a rollout and a report."""

    generate: GenerateSpec = Field(default_factory=GenerateSpec)
    train: TrainSpec = Field(default_factory=lambda: TrainSpec(time_budget=180, batch_sizes=[8]))
    infer: InferSpec = Field(default_factory=lambda: InferSpec(steps=60))
    aggregate: AggregateSpec = Field(default_factory=lambda: AggregateSpec(name="demo"))

    @model_validator(mode="after")
    def _same_dataset(self) -> "DemoSpec":
        if self.train.dataset != self.generate.dataset:
            raise ValueError(f"train.dataset {self.train.dataset!r} must equal generate.dataset {self.generate.dataset!r}")
        return self


def options_of(model: type[Spec], matrix: set[str], doc: str, base: type[Spec] = Spec) -> type[Spec]:
    """``model`` without the fields in ``matrix``: the settings a benchmark holds fixed for every cell
    (the matrix, the model to roll out and the fields the benchmark sets itself come from elsewhere)."""
    from pydantic import create_model

    fields = {name: (field.annotation, field) for name, field in model.model_fields.items() if name not in matrix}
    return create_model(model.__name__.replace("Spec", "Options"), __base__=base, __doc__=doc, **fields)


# What a benchmark's train and infer sections offer: every field but the matrix's and the internal ones.
def per_workload(cls: type[BaseModel], values: Any, kind: str) -> Any:
    """A benchmark section's ``values`` with each workload's options under its name, validated by its model; an option given
    beside the shared fields (as sections written when one flat spec held every workload's options have it) goes to every
    workload that has it."""
    if isinstance(values, (GenerateSpec, TrainSpec)):  # one workload's spec as the section: its shared settings and its options
        own = {values.workload: values.options.model_dump(exclude_unset=True)}
        values = {k: v for k, v in values.model_dump(exclude={"options"}).items() if k in cls.model_fields} | {"options": own}
    if not isinstance(values, dict):
        return values
    from tasks.common.config.workload_table import option_owners, options_model

    values = dict(values)
    given = {name: dict(o.model_dump(exclude_unset=True) if isinstance(o, BaseModel) else o) for name, o in (values.pop("options", None) or {}).items()}
    flat = {k: values.pop(k) for k in list(values) if k not in cls.model_fields}
    owners = option_owners(kind) if flat else {}
    for option, value in flat.items():
        if option not in owners:
            values[option] = value  # no workload's: refused as an unknown field
        elif value is not None:
            for name in owners[option]:
                given.setdefault(name, {}).setdefault(option, value)
    values["options"] = {name: (options_model(name, kind) or WorkloadOptions).model_validate(o) for name, o in given.items()}
    return values


class ByWorkload(Spec):
    """A benchmark section: the settings its cells share, and each workload's own options under its name."""

    options_kind: ClassVar[str]  # which of a workload's options models the section holds (TRAIN, GENERATE)
    options: dict[Annotated[str, StringConstraints(pattern=WORKLOAD_NAME)], AnyOptions] = Field(
        default_factory=dict, description="Per workload, by name, its own options for its cells (a workload left out takes its own)")

    @model_validator(mode="before")
    @classmethod
    def _gather_options(cls, values: Any) -> Any:
        return per_workload(cls, values, cls.options_kind)


# What a benchmark's train, generate and infer sections offer: every field but the matrix's and the internal ones.
class TrainOptions(options_of(TrainSpec, {"workload", "framework", "device", "batch_sizes", "resume", "cell", "options"},
                              "Everything of a training cell but its workload, framework, device and batch size, which come from the matrix "
                              "(strategy applies to tensorflow cells; dataset to karman's, the other workloads train on their own)", ByWorkload)):
    options_kind = "train"


class GenerateOptions(options_of(GenerateSpec, {"workload", "options"},
                                 "The datasets the benchmark's workloads train on: the settings they share (dataset: the sweep's, which "
                                 "karman trains on; the others train on their own) and each workload's own options", ByWorkload)):
    options_kind = "generate"

    def spec_of(self, workload: str, **update) -> GenerateSpec:
        """The generate spec of ``workload``'s dataset: the shared settings, its options from this section, and ``update``."""
        own = self.options[workload].model_dump(exclude_unset=True) if workload in self.options else {}
        values = self.model_dump(exclude={"options"}) | {"workload": workload, "options": own | update.pop("options", {})} | update
        return GenerateSpec(**values)


InferOptions = options_of(InferSpec, {"model_run", "device", "mode", "workers", "cell"},
                          "Everything of a rollout cell but its device, mode and workers (the matrix) and its model (the first trained cell)")


class WorkloadSettings(BaseModel):
    """What one workload's cells of a benchmark take instead of that workload's own defaults."""

    model_config = ConfigDict(extra="forbid")
    batch_sizes: list[PositiveInt] | None = Field(default=None, min_length=1, description="Its global batch sizes (the benchmark's batch_sizes, where given, are every workload's)")
    epochs: PositiveInt | None = Field(default=None, description="Its cells' epoch limit, over train.epochs")


class BenchmarkSpec(Spec):
    """The benchmark matrix: generate, then train (frameworks x devices x batch sizes), then roll out
    (devices x modes x workers) the first trained model, then aggregate. Each cell is its own flow
    run, tagged in MLflow with a key of its inputs and the dataset digest, so a rerun skips the cells
    that finished."""

    workloads: list[Annotated[str, StringConstraints(pattern=WORKLOAD_NAME)]] = Field(default=[DEFAULT_WORKLOAD], min_length=1, description="Workloads, by name from the workload table: karman (the Pix2Pix surrogate, with rollouts), digits (the MNIST CNN of seed 004), har (the BiLSTM of seed 002, UCI HAPT's real recordings by default), calo (the 3-D calorimeter GAN of seed 001, synthetic showers); each trains in the frameworks it has")
    frameworks: list[Literal["torch", "tensorflow", "jax"]] = Field(default=["torch"], min_length=1, description="Training frameworks: torch, tensorflow (Keras 3 under tf.distribute), jax (one process over its devices); the report puts them side by side, cell by cell; a workload's cells run in those it has (karman: torch, tensorflow, jax)")
    devices: list[Device] = Field(default=["cpu"], min_length=1, description="Training devices: cpu, cuda (a GPU pool), xla (a TPU pool)")
    batch_sizes: list[PositiveInt] | None = Field(default=None, min_length=1, description="Global batch sizes of the training matrix, every workload's; None = each workload's (per_workload's, else its own: karman 8, 16, 32, 64, digits and har 64)")
    per_workload: dict[Annotated[str, StringConstraints(pattern=WORKLOAD_NAME)], WorkloadSettings] = Field(
        default_factory=dict, description="Per workload, by name: its batch sizes and epochs where they are not its own (a preset sizes karman's "
                                          "cells this way, so the other workloads train at theirs); a workload not in the matrix is ignored")
    repeats: PositiveInt | None = Field(default=None, le=100, description="Training runs per cell, with seeds train.seed, train.seed + 1, ...: the report's time to quality is their mean, the fastest and slowest dropped from three on; None = the workload's run rules (digits, har, karman, calo: 5 runs), so its results can be complete")
    layers: list[Annotated[int, Field(gt=0, le=64)]] | None = Field(default=None, min_length=1, description="Sweep of the recurrent workloads' depth (har: stacked BiLSTM layers, seed 002's axis), one cell per value and per units value; None = each workload's own; the other workloads ignore it")
    units: list[Annotated[int, Field(gt=0, le=4096)]] | None = Field(default=None, min_length=1, description="Sweep of the recurrent workloads' width (har: units per direction and layer), crossed with layers; None = each workload's own")
    sweep: dict[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")], list[int | float | str]] = Field(
        default_factory=dict, description="Sweeps of workloads' own options, OPTION=V1:V2:...: one cell per value, crossed with each other and "
                                          "with layers and units, for the cells of each workload that has the option")

    @field_validator("sweep", mode="before")
    @classmethod
    def _sweep_values(cls, sweep: Any) -> Any:
        """The command line's OPTION=V1:V2 gives each option's values as one text: its values, each checked by the option's
        model when a cell takes it."""
        if not isinstance(sweep, dict):
            return sweep
        values = {k: v.split(":") if isinstance(v, str) else v for k, v in sweep.items()}
        for option, given in values.items():
            if not given or len(set(map(str, given))) != len(given):
                raise ValueError(f"--sweep {option}: give its values once each, colon-separated (got {':'.join(map(str, given))!r})")
        return values
    infer_devices: list[Device] = Field(default=["cpu"], min_length=1, description="Rollout devices")
    modes: list[Literal["full", "mapreduce"]] = Field(default=["full", "mapreduce"], min_length=1, description="Rollout modes: full (the whole frame on one worker) and mapreduce (tiles spread over the workers)")
    workers: list[PositiveInt] = Field(default=[1, 2], min_length=1, description="Workers of map-reduce rollouts (full-frame always uses 1)")
    train: TrainOptions = Field(default_factory=TrainOptions, description="Settings every training cell shares")
    infer: InferOptions = Field(default_factory=InferOptions, description="Settings every rollout cell shares")
    generate: GenerateOptions = Field(default_factory=GenerateOptions, description="The datasets to make (each skipped if it exists)")
    aggregate: AggregateSpec = Field(default_factory=lambda: AggregateSpec(name="benchmark"), description="The report")
    pools: dict[Device, str] = Field(default={"cuda": "gpu", "xla": "tpu"}, description="Work pool of each device's cells: a cell on device D runs deployment train/POOL or infer/POOL of D's pool; a device not listed (or mapped to local) runs in this flow's process")

    @field_validator("workloads", "devices", "batch_sizes", "infer_devices", "modes", "workers", "frameworks", "layers", "units")
    @classmethod
    def _distinct(cls, values: list | None) -> list | None:
        return values if values is None else once_each(values, "value of the matrix")

    @field_validator("pools")
    @classmethod
    def _pool_names(cls, pools: dict) -> dict:
        import re

        for device, pool in pools.items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", pool):
                raise ValueError(f"pool {pool!r} of device {device} is not a work-pool name (letters, digits, - and _)")
        return pools

    @model_validator(mode="after")
    def _same_dataset(self) -> "BenchmarkSpec":
        if self.train.dataset != self.generate.dataset:
            raise ValueError(f"train.dataset {self.train.dataset!r} must equal generate.dataset {self.generate.dataset!r}")
        if not self.infer_cells():
            raise ValueError(f"the rollout matrix has no cells: modes {self.modes} with workers {self.workers} (full-frame runs on 1 worker); add 1 to workers or mapreduce to modes")
        from pydantic import ValidationError

        from tasks.common.config.workload_table import table

        shared = self.train.model_dump(exclude={"options"})
        try:  # the checks of a whole training spec (the workload's options, strategy) hold for each workload's settings
            for workload, framework in itertools.product([w for w in self.workloads if w in table()], self.frameworks):
                # as a cell of it would be (flows.matrix.train_cell): tensorflow's strategy only; an unknown workload is the matrix's to refuse
                TrainSpec(**(shared | {"workload": workload, "device": self.devices[0], "batch_sizes": [(self.batch_sizes or [8])[0]], "framework": framework,
                                       "strategy": FRAMEWORKS[framework].strategy_of(self.train.strategy), "options": self.train.options.get(workload, {})}))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ValueError(f"train: {err.get('ctx', {}).get('error', err['msg'])}") from None
        return self

    def infer_cells(self) -> list[tuple[str, str, int]]:
        """(device, mode, workers) of every rollout cell; full-frame only at one worker."""
        return [(d, m, w) for d in self.infer_devices for m in self.modes for w in self.workers if m == "mapreduce" or w == 1]
