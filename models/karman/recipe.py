"""Training recipes of the frame-to-frame surrogate, chosen by name.

A recipe fixes what the network predicts and how it is trained, apart from its widths:

- ``predict``: ``state`` (the next frame itself, the paper's setting) or ``delta`` (the change
  x(t+k) - x(t), in units of its own per-channel RMS over the training pairs; the next frame is the
  current one plus the decoded change);
- ``upsample``: ``transpose`` (4×4 stride-2 transposed convolutions, the paper's) or ``resize``
  (nearest-neighbour doubling then a 3×3 convolution, which cannot paint a checkerboard);
- ``output``: ``tanh`` (the paper's bounded output) or ``linear``;
- ``dropout`` in the decoder's inner blocks (the paper's 0.5; it is off at rollout time either way);
- ``gan_weight`` and ``l1_weight``: the adversarial and L1 terms of the generator's loss; with
  ``gan_weight`` 0 the discriminator is not trained at all (half a step's arithmetic saved);
- ``noise``: standard deviation of Gaussian noise added to the input u, v, p (network units) at
  training time, with the delta target corrected so that the network learns to undo it;
- ``unroll``: steps of the loss; 2 or more adds the pushforward terms: the next step is predicted
  again from the network's own prediction and scored against the reference frame;
- ``pushforward``: ``detached`` (each later step starts from the prediction as a constant: the
  gradient of step n reaches the network through step n's own call only) or ``through`` (the
  gradient flows back through every earlier prediction of the unrolled chain, as in ACDM's unrolled
  training, at the memory of keeping the chain's activations);
- ``condition``: ``none`` (the network sees u, v, p and the obstacle) or ``reynolds`` (also the
  simulation's Reynolds number, as a constant input channel, as ACDM feeds it: the viscosity need
  not be inferred from the flow);
- ``curriculum``: the fraction of the run over which the loss grows from one step to ``unroll``, in
  equal parts (0: every step unrolls fully from the start); the cheaper early steps buy epochs;
- ``damping``: the fraction of the cell-scale (Nyquist) mode taken out of the predicted change by a
  fixed binomial filter (models.karman.damping), in the loss and in every rollout step alike (0: none); only
  for a recipe that predicts the change;
- ``constrain``: the physical constraints a rollout imposes after every step (u, v and p zero inside the
  obstacle, u and v of the inlet column held at the start state's) imposed on every prediction of the
  unrolled training chain as well, so that each later step sees what a rollout would feed it; rollouts
  of such a model hold the inlet (``infer --hold-inflow``) without being told; whole frames only (a
  crop's first column is not the inlet);
- ``lr`` and ``beta1`` of Adam; ``schedule``: ``constant`` or ``cosine`` (the rate falls along half a
  cosine from ``lr`` to a hundredth of it over the run: its time budget, or else its epoch limit);
- ``ngf`` and ``ndf``: the widths a training run uses unless it asks for others;
- ``frame_stride``: k, the frame t+k the network predicts from frame t.
"""

import dataclasses
from dataclasses import dataclass
from typing import Literal

from models.karman.damping import check_strength
from models.schedule import SCHEDULES


PUSHFORWARDS = ("detached", "through")
# What a model may take besides the frame: the flow's parameters as constant input channels
# ("reynolds": the simulation's Reynolds number), so it need not infer the viscosity from the flow.
CONDITIONS = ("none", "reynolds")


@dataclass(frozen=True)
class Recipe:
    name: str
    predict: Literal["state", "delta"]
    upsample: Literal["transpose", "resize"]
    output: Literal["tanh", "linear"]
    dropout: float
    gan_weight: float
    l1_weight: float
    noise: float
    unroll: int
    lr: float
    beta1: float
    ngf: int
    ndf: int
    schedule: Literal["constant", "cosine"] = "constant"
    pushforward: Literal["detached", "through"] = "detached"
    curriculum: float = 0.0
    condition: Literal["none", "reynolds"] = "none"
    damping: float = 0.0
    constrain: bool = False
    frame_stride: int = 1

    def __post_init__(self):
        if self.predict not in ("state", "delta"):
            raise ValueError(f"unknown prediction target {self.predict!r}; choose state or delta")
        if self.upsample not in ("transpose", "resize"):
            raise ValueError(f"unknown upsampling {self.upsample!r}; choose transpose or resize")
        if self.output not in ("tanh", "linear"):
            raise ValueError(f"unknown output activation {self.output!r}; choose tanh or linear")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown learning-rate schedule {self.schedule!r}; choose {' or '.join(SCHEDULES)}")
        if self.ngf < 1 or self.ndf < 1:
            raise ValueError(f"recipe {self.name!r}: widths ngf {self.ngf} and ndf {self.ndf} must be positive")
        if self.frame_stride < 1:
            raise ValueError(f"frame stride {self.frame_stride} must be at least 1 (frame t+k from frame t)")
        if self.unroll < 1:
            raise ValueError(f"unroll {self.unroll} must be at least 1 (one-step loss)")
        if self.pushforward not in PUSHFORWARDS:
            raise ValueError(f"unknown pushforward {self.pushforward!r}; choose {' or '.join(PUSHFORWARDS)}")
        if self.condition not in CONDITIONS:
            raise ValueError(f"unknown condition {self.condition!r}; choose {' or '.join(CONDITIONS)}")
        if not 0 <= self.curriculum <= 1:
            raise ValueError(f"curriculum {self.curriculum} is a fraction of the run: choose 0 (none) to 1")
        check_strength(self.damping)
        if self.damping > 0 and self.predict != "delta":
            raise ValueError(f"damping {self.damping} filters the predicted change: it needs predict delta, not {self.predict}")
        if self.noise < 0 or self.gan_weight < 0 or self.l1_weight < 0 or not 0 <= self.dropout < 1:
            raise ValueError(f"recipe {self.name!r}: noise, gan_weight and l1_weight must be >= 0 and dropout in [0, 1)")
        if self.gan_weight == 0 and self.l1_weight == 0:
            raise ValueError(f"recipe {self.name!r} has neither an adversarial nor an L1 term to train on")

    def loss_steps(self, progress: float) -> int:
        """Steps of the loss at ``progress`` (0 to 1) of the run: ``unroll``, or under a curriculum 1 in the
        first unroll-th of its span, 2 in the next, ..., ``unroll`` from its end on."""
        if self.curriculum <= 0 or self.unroll == 1:
            return self.unroll
        return min(self.unroll, 1 + int(max(progress, 0.0) * self.unroll / self.curriculum))

    def with_overrides(self, **values) -> "Recipe":
        """The recipe with the given fields replaced (None values are ignored); renamed when changed."""
        changes = {k: v for k, v in values.items() if v is not None and getattr(self, k) != v}
        if not changes:
            return self
        label = self.name + "+" + ",".join(f"{k}={v}" for k, v in sorted(changes.items()))
        return dataclasses.replace(self, name=label, **changes)


RECIPES = {
    # Isola et al. (2017) as the study used it: the next frame itself, transposed convolutions, tanh,
    # dropout, GAN + 100 L1, Adam(2e-4, beta1 0.5).
    "paper": Recipe("paper", predict="state", upsample="transpose", output="tanh", dropout=0.5,
                    gan_weight=1.0, l1_weight=100.0, noise=0.0, unroll=1, lr=2e-4, beta1=0.5,
                    ngf=64, ndf=64),
    # The measured default (README, "Training recipes"): the change of state, resize-convolutions, a
    # linear output, no dropout, L1 only, input noise, a three-step pushforward loss and a cosine
    # learning-rate decay over the run, at a width that trains to a useful surrogate in minutes on a CPU.
    "default": Recipe("default", predict="delta", upsample="resize", output="linear", dropout=0.0,
                      gan_weight=0.0, l1_weight=1.0, noise=0.01, unroll=3, lr=1e-3, beta1=0.9, ngf=16, ndf=16,
                      schedule="cosine"),
}
# Named for what docs/surrogate.md measured on a 2-core CPU, so that a user or a deployment asks for them in one word:
# "five-minute" met both 5-minute goals with two seeds (vorticity within 0.3 for 60 of 60 steps, one-step skill 0.095
# and 0.090; measured with --validate-every 0 and a 300 s budget): the loss grows from one step to two over the run.
# "long-horizon" met all five 30-minute goals with two seeds (1800 s): the Reynolds number as an input, every second
# frame, the loss growing to three steps over the first half, the predicted change damped once, more input noise.
RECIPES["five-minute"] = RECIPES["default"].with_overrides(unroll=2, curriculum=1.0)
RECIPES["long-horizon"] = RECIPES["default"].with_overrides(condition="reynolds", frame_stride=2, curriculum=0.5, damping=1.0, noise=0.02)
RECIPES["five-minute"] = dataclasses.replace(RECIPES["five-minute"], name="five-minute")
RECIPES["long-horizon"] = dataclasses.replace(RECIPES["long-horizon"], name="long-horizon")


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(sorted(RECIPES))}") from None


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2e-4
    beta1: float = 0.5
    l1_weight: float = 100.0
    gan_weight: float = 1.0  # 0: no adversarial term, the discriminator is not trained
    noise: float = 0.0  # std of Gaussian noise on the input state (network units) during training
    unroll: int = 1  # steps of the loss (2+: pushforward terms from the network's own predictions)
    pushforward: str = "detached"  # or "through": the gradient flows back through the earlier predictions
    # Delta prediction: RMS of the change over the state's scale, per output channel (network units
    # of the change -> network units of the state); None: the network predicts the state itself.
    delta_ratio: tuple[float, ...] | None = None
    damping: float = 0.0  # the predicted change's highest wavenumbers damped by this (models.karman.damping)
    fused: bool = False  # one fused Adam kernel over all parameters (CPU and CUDA; not XLA)
    # The recipe's constraints: u, v, p = 0 in network units (one value per channel), imposed inside the obstacle
    # on every state of the unrolled chain, whose inlet column's u and v are held at the start's; None: unconstrained.
    constrain: tuple[float, ...] | None = None

    @classmethod
    def from_recipe(cls, recipe, delta_ratio=None, zero=None) -> "OptimConfig":
        """The optimisation side of a Recipe (delta_ratio when it predicts changes; zero, the network units of
        u = v = p = 0, when it is constrained)."""
        ratio = tuple(float(r) for r in delta_ratio) if recipe.predict == "delta" else None
        if recipe.predict == "delta" and ratio is None:
            raise ValueError(f"recipe {recipe.name!r} predicts changes: its delta_ratio is needed")
        if recipe.constrain and zero is None:
            raise ValueError(f"recipe {recipe.name!r} is constrained: the network units of a zero state are needed")
        return cls(lr=recipe.lr, beta1=recipe.beta1, l1_weight=recipe.l1_weight, gan_weight=recipe.gan_weight,
                   noise=recipe.noise, unroll=recipe.unroll, pushforward=recipe.pushforward, delta_ratio=ratio,
                   damping=recipe.damping, constrain=tuple(float(z) for z in zero) if recipe.constrain else None)
