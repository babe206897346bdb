"""Karman's own commands' specs: the solver's validation (Schäfer-Turek) and the ablation of its training recipe."""

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from tasks.common.specs import FOLDER_NAME, DatasetName, Spec, TrainSpec, once_each


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
