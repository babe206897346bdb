"""Typed, validated options of the bench-… commands: one spec per command, from which their command lines are generated.

Like the pipeline's specs (tasks.common.specs), but for standalone measurements: they import only
pydantic, models and those specs, so a bench command loads no Prefect or MLflow. Their descriptions are written for
the command line: an option whose default is unset says there what happens then, and a flag that is on
by default is described by what its ``--no-…`` form does.
"""

import math
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from models.host import DeviceKind
from models.karman.nets.config import check_cuda_graph
from models.karman.tiling import DEFAULT_HALO
from tasks.common.specs import DEFAULT_WORKLOAD, WORKLOAD_NAME


def _checked_number(value, kind: type, strict: bool):
    """``value`` (text or a number) as a finite ``kind`` (int or float), above 0 (``strict``) or at least 0; None stays None."""
    if value is None:
        return None
    noun = "integer" if kind is int else "number"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or (kind is int and isinstance(value, float) and not value.is_integer()):
        raise PydanticCustomError("bench_number", f"{value!r} is not {'an' if kind is int else 'a'} {noun}")
    try:
        number = kind(value)
    except ValueError:
        raise PydanticCustomError("bench_number", f"{value!r} is not {'an' if kind is int else 'a'} {noun}") from None
    if not math.isfinite(number):
        raise PydanticCustomError("bench_number", f"{value!r} is not a finite number")
    if strict and not number > 0:
        raise PydanticCustomError("bench_number", f"{number} must be a positive {noun}")
    if not number >= 0:
        raise PydanticCustomError("bench_number", f"{number} is negative; use 0 or more")
    return number


def _number(kind: type, strict: bool) -> BeforeValidator:
    return BeforeValidator(lambda value: _checked_number(value, kind, strict))


# The validator sits outside ``| None``, so an error names the field alone, and None passes through.
PositiveInt = Annotated[int, _number(int, strict=True)]
NonNegativeInt = Annotated[int, _number(int, strict=False)]
PositiveFloat = Annotated[float, _number(float, strict=True)]
OptionalPositiveInt = Annotated[int | None, _number(int, strict=True)]
OptionalPositiveFloat = Annotated[float | None, _number(float, strict=True)]
OptionalNonNegativeFloat = Annotated[float | None, _number(float, strict=False)]


def _tile_shape(value):
    """'S' or 'H,W' (the syntax of ``infer --tile``), or one or two sides -> (H, W) positive ints; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        parts = value.split(",")
        if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
            raise PydanticCustomError("bench_tile", f"{value!r} is not a tile size; write S or H,W, e.g. 64 or 256,576")
        value = parts
    if not isinstance(value, (list, tuple)) or len(value) not in (1, 2):
        raise PydanticCustomError("bench_tile", f"{value!r} is not a tile size; write S or H,W, e.g. 64 or 256,576")
    sides = [_checked_number(side, int, strict=True) for side in value]
    return (sides[0], sides[-1])


OptionalTileShape = Annotated[tuple[int, int] | None, BeforeValidator(_tile_shape)]
Device = DeviceKind  # the device kinds, named once (models.host)


class BenchSpec(BaseModel):
    """A bench command's options, validated once at the command's entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # The command line's help is the description as written, with the default where one is set: a
    # description states what an unset default means, and how a list is given.
    cli_help_as_written: ClassVar[bool] = True


class BenchSolverSpec(BenchSpec):
    """Time the solver's full production step (MLUPS)."""

    nx: PositiveInt = Field(default=1024, description="Channel length in nodes")
    ny: PositiveInt = Field(default=256, description="Channel height in nodes")
    steps: PositiveInt = Field(default=200, description="Steps per timed run")
    repeats: PositiveInt = Field(default=5, description="Timed runs; the median is reported")
    backend: Literal["numba", "numpy", "torch", "triton"] = Field(default="numba", description="Solver backend: numba and numpy on the CPU, torch on any torch device, triton (one fused kernel per step) on cuda")
    dtype: Literal["float32", "float64"] = Field(default="float32", description="Precision of the populations")
    device: str = Field(default="cpu", description="torch device for --backend torch or triton, e.g. cuda")
    batch: PositiveInt = Field(default=1, description="Simulations advanced together in one launch per step, each with its own Reynolds number (triton only)")

    @model_validator(mode="after")
    def _backend_offers(self) -> "BenchSolverSpec":
        from models.karman.solver import backend_from_name

        backend = backend_from_name(self.backend)
        if self.batch > 1 and not backend.batched:
            raise ValueError(f"batch {self.batch}: many simulations per launch are offered by the triton backend only; use batch 1 with {self.backend}")
        if not backend.on_device and self.device != "cpu":
            raise ValueError(f"device {self.device!r}: the {self.backend} backend runs on the cpu; use --backend triton or torch for {self.device}")
        return self


class CompareDatasetsSpec(BenchSpec):
    """How far two datasets of the same sweep differ, frame by frame (e.g. one simulated on a GPU, one on the CPU)."""

    first: str = Field(description="Dataset name in the data root")
    second: str = Field(description="Dataset name in the data root, of the same sweep")


class BenchTrainSpec(BenchSpec):
    """Time Pix2Pix training (samples/s) against a plain eager fp32 step, in one run."""

    workload: str = Field(default=DEFAULT_WORKLOAD, pattern=WORKLOAD_NAME, description="Workload whose training step to time, by name from the workload table; one without a bench-train part of its own is refused, naming those that have one")
    framework: Literal["torch", "tensorflow"] = Field(default="torch", description="torch (our trainer), or tensorflow (the Keras step in its own process, timed against our torch trainer and the plain torch step in the same run)")
    device: Device = Field(default="cpu", description="Device kind")
    size: PositiveInt = Field(default=256, description="Image side; sets the U-Net depth to log2(size)")
    batch_size: PositiveInt = Field(default=1, description="Batch size")
    steps: PositiveInt = Field(default=3, description="Training steps per timed block")
    repeats: PositiveInt = Field(default=3, description="Timed blocks per side; medians are reported")
    precision: Literal["fp32", "bf16"] = Field(default="fp32", description="fp32, or bf16 autocast")
    baseline: bool = Field(default=True, description="Skip the plain eager fp32 comparison")
    peak_tflops: OptionalPositiveFloat = Field(default=None, description="Peak of the device in TFLOP/s for the model FLOP utilization (default: known GPUs only)")
    jit_compile: bool = Field(default=False, description="tensorflow: XLA-compile the step (jit_compile)")
    compile: Literal["auto", "on", "off"] = Field(default="auto", description="torch: torch.compile our trainer's networks (auto: off)")
    cuda_graph: Literal["auto", "on", "off"] = Field(default="auto", description="torch: record our trainer's step as CUDA graphs (auto: on for cuda)")

    @model_validator(mode="after")
    def _graphs_need_cuda(self) -> "BenchTrainSpec":
        check_cuda_graph(self.cuda_graph, self.device)
        return self


class BenchInferSpec(BenchSpec):
    """Time a rollout step (frames/s), full-frame or map-reduce over workers, against the solver."""

    workload: str = Field(default=DEFAULT_WORKLOAD, pattern=WORKLOAD_NAME, description="Workload whose rollout step to time, by name from the workload table; one without a bench-infer part of its own is refused, naming those that have one")
    mode: Literal["full", "mapreduce"] = Field(default="mapreduce", description="full: the whole frame on one worker; mapreduce: tiles over the workers")
    workers: PositiveInt = Field(default=1, description="Compute units: CPU cores (one thread each), GPUs or XLA devices")
    device: Device = Field(default="cpu", description="Device kind")
    size: PositiveInt = Field(default=256, description="Frame height in cells")
    width: OptionalPositiveInt = Field(default=None, description="Frame width in cells (default: 4 x size)")
    tile: OptionalTileShape = Field(default=None, description="Tile side S, or H,W; multiples of 2^depth (default: frame height x half the width plus the halo, rounded up)")
    halo: NonNegativeInt = Field(default=DEFAULT_HALO, description="Pixels each tile reaches into its neighbours (the overlap is twice this)")
    group: OptionalPositiveInt = Field(default=None, description="Tiles per batch (default: tiles / workers, rounded up)")
    train_size: PositiveInt = Field(default=64, description="Side the generator was trained on; sets its depth log2(S)")
    ngf: PositiveInt = Field(default=64, description="Generator base width (the paper's 64)")
    frames: PositiveInt = Field(default=3, description="Autoregressive steps per timed block")
    repeats: PositiveInt = Field(default=3, description="Timed blocks per configuration; medians are reported")
    frame_stride: PositiveInt = Field(default=1, description="k: the network advances k stored frames per step")
    frame_every: OptionalPositiveInt = Field(default=None, description="Solver steps between stored frames (default: 50 x size / 64)")
    compare: bool = Field(default=True, description="Skip timing full-frame and map-reduce on one worker in the same run")


MatmulFramework = Literal["torch", "tensorflow", "jax"]
MatmulDtype = Literal["fp32", "tf32", "bf16", "fp16"]


def _unique(values: list) -> list:
    return list(dict.fromkeys(values))


class BenchMatmulSpec(BenchSpec):
    """Time square matrix products (TFLOP/s, cold and warm) per framework and dtype, against the device's peak."""

    frameworks: Annotated[list[MatmulFramework], AfterValidator(_unique)] = Field(
        default=["torch", "tensorflow", "jax"], min_length=1, description="Frameworks, each in its own process; comma-separated (default: torch,tensorflow,jax)")
    device: Device = Field(default="cpu", description="Device kind")
    dtypes: Annotated[list[MatmulDtype], AfterValidator(_unique)] = Field(
        default=[], description="Dtypes, comma-separated (default: the device's own: fp32,bf16 on cpu and xla; fp32,tf32,bf16,fp16 on cuda)")
    sizes: Annotated[list[PositiveInt], AfterValidator(_unique)] = Field(
        default=[], description="Matrix sides n, comma-separated (default: 1024,2048,4096 on cpu; 2048,4096,8192 on cuda and xla)")
    repeats: PositiveInt = Field(default=5, description="Warm products per size; the median is reported")
    threads: OptionalPositiveInt = Field(default=None, description="CPU cores the children may run on (default: all this process may use)")
    log: bool = Field(default=True, description="Write nothing: no MLflow runs, no entry in the ceiling cache")

    def resolved_dtypes(self) -> list[str]:
        from tasks.common.measures.matmul import DEFAULT_DTYPES

        return list(self.dtypes or DEFAULT_DTYPES[self.device])

    def resolved_sizes(self) -> list[int]:
        return list(self.sizes or ([1024, 2048, 4096] if self.device == "cpu" else [2048, 4096, 8192]))


# The training settings bench-quality shares with ``python -m flows train``: the same fields, ranges and
# defaults as TrainSpec's, declared there once.
QUALITY_TRAINING = ("workload", "dataset", "time_budget", "epochs", "recipe", "predict", "upsample", "schedule", "noise", "unroll", "pushforward",
                    "curriculum", "condition", "damping", "constrain", "gan_weight",
                    "l1_weight", "lr", "ngf", "ndf", "seed", "target_vorticity", "target_steps", "validate_every", "validate_steps",
                    "stop_at_target", "target_accuracy", "threads", "compile", "cuda_graph", "precision")


class _BenchQualityOwn(BenchSpec):
    """What bench-quality adds to the training settings: its device and batch, the repeats and the rollouts after training."""

    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Device kind")
    batch_size: PositiveInt = Field(default=8, description="Batch size; left out, the workload's own first")
    repeats: PositiveInt = Field(default=1, description="Runs, with seeds seed, seed+1, ...")
    test_steps: PositiveInt = Field(default=60, description="karman: steps of the final rollout on the test simulation")
    extra_dataset: list[str] = Field(default=[], description="karman: also roll out on every simulation of this dataset (repeatable)")
    extra_steps: PositiveInt = Field(default=600, description="karman: steps of those rollouts")

    def train_spec(self):
        """The training spec the first run trains with (``python -m flows train`` takes the same), holding what this request
        gave (so that the rest can come from its workload, tasks.workloads.with_own_defaults); ValidationError naming what
        does not fit (a target longer than the validation rollout, ...)."""
        from tasks.common.specs import TrainSpec

        given = {k: v for k, v in self.model_dump(include=(set(QUALITY_TRAINING) | {"device"}) & self.model_fields_set).items() if v is not None}
        return TrainSpec(**given, **({"batch_sizes": [self.batch_size]} if "batch_size" in self.model_fields_set else {}))


def _quality_spec() -> type[BenchSpec]:
    from pydantic import create_model

    from tasks.common.specs import TrainSpec
    from tasks.common.config.workload_table import option_owners, options_model

    owners = option_owners()  # a workload's option: its field as the first workload that has it declares it
    found = {name: TrainSpec.model_fields.get(name) or options_model(owners[name][0]).model_fields[name] for name in QUALITY_TRAINING}
    fields = {name: (field.annotation, field) for name, field in found.items()}
    return create_model("BenchQualitySpec", __base__=_BenchQualityOwn, __module__=__name__,
                        __doc__="Time to quality: train a recipe on a stored dataset until a rollout target holds, then score rollouts "
                                "and compare with the solver.", **fields)


BenchQualitySpec = _quality_spec()


class HistorySpec(BenchSpec):
    """Each cell's results across code and framework versions, from the experiment's training runs, with steps beyond the noise flagged."""

    metric: Literal["time_per_epoch_s", "samples_per_s", "time_to_target_s"] = Field(
        default="time_per_epoch_s", description="The result compared between versions: seconds per epoch, samples/s or time to target")
    min_change: float = Field(default=0.10, gt=0, lt=10, description="The smallest relative change of a cell's median flagged "
                              "(a larger one where the versions' runs scatter: three times their half range)")



def _has_reference(name: str) -> str:
    from tasks.workloads import with_references

    known = with_references()
    if name not in known:
        raise PydanticCustomError("bench_reference", f"bench-frameworks has idiomatic references for {', '.join(known)} only")
    return name


class BenchFrameworksSpec(BenchSpec):
    """Time each framework's training of a workload against that framework's idiomatic reference (samples/s, ours / reference), in one run."""

    workload: Annotated[str, AfterValidator(_has_reference)] = Field(description="Workload, one with idiomatic references: digits, har or karman (the default recipe's step, on the karman-demo sweep unless --dataset names another)")
    frameworks: Annotated[list[MatmulFramework], AfterValidator(_unique)] = Field(
        default=["torch", "tensorflow", "jax"], min_length=1, description="Frameworks, each in its own process, one after the other; comma-separated (default: torch,tensorflow,jax)")
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Device kind")
    dataset: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Stored dataset to train on (default: the workload's own, as generate writes it)")
    batch_size: OptionalPositiveInt = Field(default=None, description="Batch size (default: the workload's first benchmark batch: 64 for digits and har, 8 for karman)")
    steps: OptionalPositiveInt = Field(default=None, description="Optimiser steps per timed block (default: one epoch's)")
    repeats: PositiveInt = Field(default=3, description="Timed blocks per side; medians are reported")
    seed: NonNegativeInt = Field(default=0, description="Seed of the initial weights and the batches' order")
    threads: OptionalPositiveInt = Field(default=None, description="CPU threads of each framework (default: all cores)")
    profile: bool = Field(default=False, description="Then run one more block of each side under the framework's own profiler and report its ops with the most self time")
