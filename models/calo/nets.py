"""The 3DGAN networks' shapes, framework-neutral: the published generator and discriminator layer by layer, scaled by one width, their parameter counts, initial weights and training FLOPs.

Layer structure as published by CERN openlab (3DGAN for 51x51x25 electron showers conditioned on energy
and angle; the TensorFlow 2 distributed version of R. Cardoso and S. Vallecorsa), channels last, spatial
order (x, y, z):

* generator: latent (energy / 100 GeV, angle in radians, 254 normal numbers) -> dense 9*9*8*8 -> reshape
  (9, 9, 8, 8) -> nearest upsampling x6 (54, 54, 48) -> conv 8 (6,6,8) valid, relu, BN -> [zero-pad (2,2,1),
  conv 6 (4,4,6), relu, BN] x3 -> pad (1,1,0), conv 6 (3,3,5), relu, BN -> pad (1,1,0), conv 6 (3,3,3), relu
  -> conv 1 (2,2,2), relu: (51, 51, 25, 1).
* discriminator: image (51, 51, 25, 1) -> conv 16 (5,6,6) same, leaky relu 0.3, dropout 0.2 -> pad (0,0,1),
  conv 8 (5,6,6), leaky, BN, dropout -> pad (0,0,1), conv 8 (5,6,6), leaky, BN, dropout -> conv 8 (5,6,6), leaky,
  BN, dropout -> average pool 2 -> flatten (19*18*7*8) -> real/fake (dense 1, sigmoid) and energy (dense 1,
  linear) heads; two heads without weights: the barycentre angle and the energy sum of image^(1/0.85).
* BN: batch normalisation, epsilon 1e-6, momentum 0.99 (Keras' convention). ``width`` scales every channel
  count (at least 1), ``latent`` the latent size: a smaller configuration keeps the structure.
* ``pool``: a coarser grid with the same layers. pool 3 merges 3 x 3 cells of each layer (51 x 51 -> 17 x 17,
  cells of 3 X0 across, the 25 layers kept, so the longitudinal profile and the energy sum are those of the
  published grid); the generator starts from a (5, 5, 8) seed upsampled by (4, 4, 6) so that the same
  convolutions end at (17, 17, 25), and the angle head measures in X0 (cells 3 wide).
* ``energy_scaled``: a calorimeter's response is close to linear in the primary's energy, which the published
  generator has to learn from one of its latent inputs; with it the last layer's output is multiplied by
  (E / 100 GeV)^POWER (the first latent input to that power: the image holds deposits^POWER), so the network
  learns a 100 GeV shower's shape and its energy dependence beyond the linear one. It adds no weights.
* ``profile``: the weight of a term of the generator's loss beside the published four (not in the published
  network), on the longitudinal profile (each shower's energy per layer over its sum) and the energy sum of the
  generated showers against the real showers of the same conditions in the step's batch. Per layer, and for the
  sum (the log of the generated shower's over the real one's: their ratio less 1, tried first, is unbounded, and
  a first epoch's sums orders of magnitude off let it swamp every other term), it takes two differences: of the
  batch means (the level), and of the slope against the primary energy (the mean over the batch of the
  difference times the energy's offset from the batch's mean, over that offset's RMS: a shower starts and peaks
  deeper at a higher energy, which the level alone, averaged over a batch of mixed energies, does not see). Each
  squared, over max(the real mean share, PROFILE_FLOOR) squared for a layer and 1 for the sum, and averaged over
  the layers and the sum. The published loss matches the energy sum through the ECAL-sum head's absolute
  percentage error, whose gradient has the same size however small the error; with it and the layers' terms
  alone a CPU run (seed 1) ended with its sampling fraction 1.01, 1.06 and 1.10 times the data's in the three
  energy bins (docs/har-and-calo.md). Squared, so that the noise of a small batch's real profile averages out
  rather than biasing the target (as an absolute error's median would).

Weights in one layout for every framework: conv kernels (kx, ky, kz, in, out), dense kernels (in, out).
"""

from dataclasses import dataclass

import numpy as np

from models.schedule import SCHEDULES

IMAGE = (51, 51, 25)
SEED_GRID = (9, 9, 8)  # the generator's dense output, before upsampling
UPSAMPLE = 6
# pool (cells merged across) -> (seed grid, upsampling per axis): the published grid, and one three times coarser across
GRIDS = {1: (SEED_GRID, (UPSAMPLE,) * 3), 3: ((5, 5, 8), (4, 4, 6))}
LEAKY_SLOPE = 0.3  # Keras' LeakyReLU default, which the published discriminator uses
BN_EPSILON, BN_MOMENTUM = 1e-6, 0.99
POWER = 0.85  # the images enter the discriminator as deposits^0.85; its sum and angle heads undo it
ENERGY_SCALE = 100.0  # GeV: energy labels and the generator's energy input are E / 100 GeV
LOSS_WEIGHTS = {"real_fake": 3.0, "energy": 0.1, "angle": 25.0, "ecal_sum": 0.1}  # BCE, MAPE, MAE, MAPE
PROFILE_FLOOR = 0.01  # the profile term's denominators: a layer's real share, at least 1 % of the shower
LEARNING_RATE = 1e-3  # RMSprop, both networks (Keras' defaults otherwise: rho 0.9, epsilon 1e-7)


@dataclass(frozen=True)
class NetConfig:
    """latent: the generator's input size (2 conditions + noise); width: channel multiplier; dropout: the
    discriminator's rate; pool: cells merged across per side (1: the published 51 x 51 grid, 3: 17 x 17);
    energy_scaled: the generator's image multiplied by (E / 100 GeV)^POWER, so that its deposits are a 100 GeV
    shower's scaled by the primary's energy (not in the published network: no weights, see the module);
    average: the decay of a moving average of the generator's weights that generates for validation, test and
    the saved model (0: none, as published; see average_decay); profile: the weight of the longitudinal
    profile term of the generator's loss (0: none, as published; see the module); schedule: both networks'
    learning rate over the run, ``constant`` (as published) or ``cosine`` (models.schedule.lr_factor: half a
    cosine down to a hundredth over the time budget, else the epoch limit)."""

    latent: int = 256
    width: float = 1.0
    dropout: float = 0.2
    pool: int = 1
    energy_scaled: bool = False
    average: float = 0.0
    profile: float = 0.0
    schedule: str = "constant"

    def __post_init__(self):
        if self.pool not in GRIDS:
            raise ValueError(f"pool {self.pool}: the 3DGAN grids are {', '.join(map(str, GRIDS))} cells merged across")
        if self.profile < 0:
            raise ValueError(f"profile weight {self.profile}: choose 0 (none) or more")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"learning-rate schedule {self.schedule!r}: choose {' or '.join(SCHEDULES)}")

    def ch(self, c: int) -> int:
        return max(1, int(round(c * self.width)))

    @property
    def image(self) -> tuple[int, int, int]:
        """The images' (x, y, z) cells."""
        return (IMAGE[0] // self.pool, IMAGE[1] // self.pool, IMAGE[2])

    @property
    def seed_grid(self) -> tuple[int, int, int]:
        return GRIDS[self.pool][0]

    @property
    def upsample(self) -> tuple[int, int, int]:
        return GRIDS[self.pool][1]

    @property
    def cell(self) -> tuple[float, float, float]:
        """A cell's (x, y, z) extent in published cells (X0): what the angle head measures in."""
        return (float(self.pool), float(self.pool), 1.0)


def average_decay(cfg: NetConfig, updates: int) -> float:
    """The old average's weight in the generator's moving average after ``updates`` earlier steps: cfg.average,
    less at first ((1 + n) / (10 + n)), so that the initial weights fade out within the first steps. Batch-norm
    statistics are copied, not averaged (they are moving averages already)."""
    return min(cfg.average, (1.0 + updates) / (10.0 + updates))


PUBLISHED = NetConfig()
SMALL = NetConfig(latent=32, width=0.5)  # the CPU configuration of the tests: the same layers, fewer channels


@dataclass(frozen=True)
class Conv:
    name: str
    cin: int
    cout: int
    kernel: tuple[int, int, int]
    pad: tuple[tuple[int, int], ...]  # zero padding before the convolution, (before, after) per spatial axis
    out: tuple[int, int, int]  # output spatial shape
    bn: bool


def _conv(name, cin, cout, kernel, pad, shape, bn) -> Conv:
    pad = tuple((p, p) if isinstance(p, int) else p for p in pad)
    out = tuple(s + p[0] + p[1] - k + 1 for s, p, k in zip(shape, pad, kernel))
    return Conv(name, cin, cout, kernel, pad, out, bn)


def generator_convs(cfg: NetConfig) -> list[Conv]:
    c0, c8, c6 = cfg.ch(8), cfg.ch(8), cfg.ch(6)
    layers = []
    shape = tuple(s * u for s, u in zip(cfg.seed_grid, cfg.upsample))
    for name, cin, cout, kernel, pad, bn in (("g1", c0, c8, (6, 6, 8), (0, 0, 0), True), ("g2", c8, c6, (4, 4, 6), (2, 2, 1), True),
                                             ("g3", c6, c6, (4, 4, 6), (2, 2, 1), True), ("g4", c6, c6, (4, 4, 6), (2, 2, 1), True),
                                             ("g5", c6, c6, (3, 3, 5), (1, 1, 0), True), ("g6", c6, c6, (3, 3, 3), (1, 1, 0), False),
                                             ("g7", c6, 1, (2, 2, 2), (0, 0, 0), False)):
        layers.append(_conv(name, cin, cout, kernel, pad, shape, bn))
        shape = layers[-1].out
    assert shape == cfg.image, shape
    return layers


def discriminator_convs(cfg: NetConfig) -> list[Conv]:
    c16, c8 = cfg.ch(16), cfg.ch(8)
    same = ((2, 2), (2, 3), (2, 3))  # 'same' for (5, 6, 6): the odd pixel after, as Keras pads
    layers = [_conv("d1", 1, c16, (5, 6, 6), same, cfg.image, False)]
    for name, cin, pad in (("d2", c16, (0, 0, 1)), ("d3", c8, (0, 0, 1)), ("d4", c8, (0, 0, 0))):
        layers.append(_conv(name, cin, c8, (5, 6, 6), pad, layers[-1].out, True))
    return layers


def seed_channels(cfg: NetConfig) -> int:
    return cfg.ch(8)


def flat_features(cfg: NetConfig) -> int:
    """The discriminator's features after the average pool, (x, y, z, c) order."""
    return int(np.prod([s // 2 for s in discriminator_convs(cfg)[-1].out])) * cfg.ch(8)


def weight_shapes(cfg: NetConfig) -> dict[str, dict[str, tuple[int, ...]]]:
    """Every trainable weight and batch-norm statistic of both networks, in the one layout, by network."""
    dense = int(np.prod(cfg.seed_grid)) * seed_channels(cfg)
    g = {"dense/kernel": (cfg.latent, dense), "dense/bias": (dense,)}
    d = {}
    for net, convs in ((g, generator_convs(cfg)), (d, discriminator_convs(cfg))):
        for c in convs:
            net[f"{c.name}/kernel"], net[f"{c.name}/bias"] = (*c.kernel, c.cin, c.cout), (c.cout,)
            if c.bn:
                for part in ("gamma", "beta", "moving_mean", "moving_variance"):
                    net[f"{c.name}_bn/{part}"] = (c.cout,)
    for head in ("fake", "aux"):
        d[f"{head}/kernel"], d[f"{head}/bias"] = (flat_features(cfg), 1), (1,)
    return {"generator": g, "discriminator": d}


def parameter_counts(cfg: NetConfig) -> dict[str, dict[str, int]]:
    """Trainable parameters and all weights (with batch-norm moving statistics) of each network."""
    out = {}
    for net, shapes in weight_shapes(cfg).items():
        total = sum(int(np.prod(s)) for s in shapes.values())
        moving = sum(int(np.prod(s)) for k, s in shapes.items() if "moving" in k)
        out[net] = {"trainable": total - moving, "total": total}
    return out


def initial_weights(cfg: NetConfig, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Initial weights (float32, the one layout), a function of ``seed`` only: kernels He-uniform (the
    published generator's), biases zero, batch norm gamma 1, beta 0, moving mean 0, moving variance 1."""
    rng = np.random.default_rng([seed, 30])
    out = {}
    for net, shapes in weight_shapes(cfg).items():
        w = {}
        for name, shape in shapes.items():
            if name.endswith("/kernel"):
                bound = np.sqrt(6.0 / int(np.prod(shape[:-1])))
                w[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
            else:
                w[name] = (np.ones if name.endswith(("gamma", "moving_variance")) else np.zeros)(shape, np.float32)
        out[net] = w
    return out


def multiply_adds(cfg: NetConfig) -> dict[str, list[int]]:
    """Forward multiply-adds of each weight layer for one sample, in order, per network (dense first for the generator, heads last for the discriminator)."""
    g = [cfg.latent * int(np.prod(cfg.seed_grid)) * seed_channels(cfg)]
    g += [int(np.prod(c.out)) * int(np.prod(c.kernel)) * c.cin * c.cout for c in generator_convs(cfg)]
    d = [int(np.prod(c.out)) * int(np.prod(c.kernel)) * c.cin * c.cout for c in discriminator_convs(cfg)]
    d += [2 * flat_features(cfg)]
    return {"generator": g, "discriminator": d}


def train_flops_per_sample(cfg: NetConfig) -> float:
    """Training FLOPs of one sample of the batch in one step of the four tapes (a multiply-add = 2 FLOPs):
    (1) D on real images: D forward, D weight gradients, D input gradients but the first layer's;
    (2) D on generated images: G forward (inference) and the same D work; (3, 4) G twice: G forward, D
    forward, D input gradients of every layer (no D weight gradients: D is frozen), G weight gradients and
    G input gradients but the first layer's. Biases, activations, batch norm, pooling, upsampling and the
    losses are left out (elementwise)."""
    m = multiply_adds(cfg)
    g, d = sum(m["generator"]), sum(m["discriminator"])
    d_step = 3 * d - m["discriminator"][0]
    g_step = g + d + d + g + (g - m["generator"][0])
    return float(2 * (d_step + (g + d_step) + 2 * g_step))


def pool_cells(cells: np.ndarray, pool: int) -> np.ndarray:
    """Cell energies (n, 51, 51, 25) -> (n, 51 // pool, 51 // pool, 25): each layer's pool x pool blocks summed
    (the outermost cells of the published grid that do not fill a block, none for pool 1 or 3, dropped)."""
    if pool == 1:
        return cells
    n, nx, ny, nz = cells.shape
    mx, my = nx // pool, ny // pool
    return cells[:, :mx * pool, :my * pool].reshape(n, mx, pool, my, pool, nz).sum(axis=(2, 4), dtype=np.float32)
