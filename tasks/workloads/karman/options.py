"""Karman's own options: its training's recipe, widths, rollout validation and split, and its dataset's solver sweep.

A run or a dataset of another workload holds none of them.
"""

from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator

from tasks.common.tracking.names import Tag
from tasks.common.specs import WorkloadOptions, once_each


class KarmanOptions(WorkloadOptions):
    """The Kármán surrogate's training: Pix2Pix on (frame t -> frame t+k) pairs of the solver's sweep."""

    validate_steps: PositiveInt = Field(default=60, le=100_000, description="Steps of each validation rollout")
    target_vorticity: PositiveFloat = Field(default=0.3, description="Quality target: vorticity relative L2 at most this ...")
    target_steps: PositiveInt = Field(default=40, description="... for the first this many steps of every validation rollout")
    frame_stride: PositiveInt | None = Field(default=None, description="k: predict frame t+k from frame t; None = the recipe's (1; long-horizon 2)")
    ngf: PositiveInt | None = Field(default=None, le=1024, description="Generator base width; None = the recipe's (default 16, paper 64)")
    ndf: PositiveInt | None = Field(default=None, le=1024, description="Discriminator base width; None = the recipe's (default 16, paper 64)")
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
    schedule: Literal["constant", "cosine"] | None = Field(default=None, description="Learning-rate schedule: constant, or cosine (half a cosine down to a hundredth of the rate over the time budget, else over the epoch limit); None = the recipe's")
    l1_weight: float | None = Field(default=None, ge=0, description="Weight of the L1 term; None = the recipe's")
    channels_last: Literal["auto", "on", "off"] = Field(default="auto", description="NHWC memory layout; auto = on for cuda only (slower on CPU)")
    cuda_graph: Literal["auto", "on", "off"] = Field(default="auto", description="Record the torch trainer's step as CUDA graphs and replay them (one process on a CUDA GPU; auto = on for cuda)")
    winograd: Literal["auto", "on", "off"] = Field(default="auto", description="Winograd F(3x3,4x4) for the discriminator's wide stride-1 layer (CPU, fp32 only); auto = on for cpu")
    val_simulations: int = Field(default=1, ge=0, description="Simulations held out for validation (scored by rollouts during training); taken inside the sweep's Reynolds range")
    test_simulations: int = Field(default=1, ge=0, description="Simulations held out for testing (rollout); taken inside the sweep's Reynolds range, so the test interpolates")

    def check(self, spec) -> None:
        from models.karman.nets.config import check_cuda_graph

        recipe = self.resolved_recipe()  # ValueError naming the element that does not fit
        if self.crop and recipe.constrain:
            raise ValueError(f"constrain holds the inlet column: it trains on whole frames, not crops of {self.crop} (leave out --crop)")
        check_cuda_graph(self.cuda_graph, spec.device)
        if self.target_steps > self.validate_steps:
            raise ValueError(f"target_steps {self.target_steps} exceeds validate_steps {self.validate_steps}: the validation rollout must be at least as long as the target")

    def resolved_recipe(self):
        """The models.karman.recipe.Recipe these options train with: the named recipe and its overrides."""
        from models.karman.recipe import get_recipe

        return get_recipe(self.recipe).with_overrides(
            predict=self.predict, upsample=self.upsample, noise=self.noise, unroll=self.unroll,
            gan_weight=self.gan_weight, lr=self.lr, l1_weight=self.l1_weight, ngf=self.ngf, ndf=self.ndf,
            schedule=self.schedule, pushforward=self.pushforward, curriculum=self.curriculum,
            condition=self.condition, damping=self.damping, constrain=self.constrain or None, frame_stride=self.frame_stride)

    @property
    def stride(self) -> int:
        """The frame stride it trains at: the one given, else the recipe's."""
        return self.resolved_recipe().frame_stride

    def tags(self) -> dict[str, str]:
        return {Tag.RECIPE: self.resolved_recipe().name}

    def key_fields(self) -> dict[str, Any]:
        """The frame stride resolved, so that options that leave it to the recipe and options that name the recipe's own
        stride (as every spec did before a recipe could set it) are one cell; cuda_graph, added after cells were first
        keyed, is left out at its default so that a cell keeps its key across the version that added it."""
        fields = super().key_fields() | {"frame_stride": self.stride}
        return {k: v for k, v in fields.items() if not (k == "cuda_graph" and v == "auto")}

    @classmethod
    def key_padding(cls) -> dict[str, Any]:
        return KarmanOptions().key_fields()


class KarmanSweep(WorkloadOptions):
    """Karman's dataset: a parameter sweep of channel flows past obstacles (lattice units), simulated by the solver."""

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
    cpu_backend: Literal["numba", "numpy"] = Field(default="numba", description="Solver backend of a cpu sweep: numba (the fused kernel) or numpy (the reference operators, slow)")
    verify: bool = Field(default=False, description="Read every complete simulation back against its digest and simulate again those whose data is damaged or lost")

    @field_validator("reynolds", "shapes", "size", "x_position", "y_offset")
    @classmethod
    def _no_repeats(cls, values: list) -> list:
        return once_each(values, "value of a sweep")

    def check(self, spec) -> None:
        if self.verify and spec.overwrite:
            raise ValueError("--verify repairs the dataset and --overwrite deletes it first: give one of them")


TRAIN, GENERATE = KarmanOptions, KarmanSweep
