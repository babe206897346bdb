"""The Pix2Pix networks in JAX: the torch U-Net and PatchGAN of pix2pix.py as pure functions of their weights, NHWC inside.

The weights are the torch networks' state under their state_dict names and in their layouts (convolutions
(O, I, kh, kw), transposed ones (I, O, kh, kw)), split into ``params`` (what the optimiser trains) and
``stats`` (batch norm's running mean and variance), so a torch state dict loads as it is and a saved JAX
generator is a torch state dict's arrays. Batch norm in training takes the batch's statistics and moves
the running ones as torch does (momentum 0.1, the unbiased variance); each call returns the new stats.

The 4x4 stride-2 transposed convolution is computed as four 2x2 stride-1 convolutions, one per output
phase, interleaved: the same sums as torch's ConvTranspose2d(k=4, s=2, p=1), but XLA's CPU backend takes
the gradient of the input-dilated convolution that jax.lax would otherwise use a hundred times slower
(12 s against 0.5 s for one layer of the paper's network at batch 8, measured on a 2-core CPU).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from models.karman.nets.config import NetConfig

SLOPE, EPS, MOMENTUM = 0.2, 1e-5, 0.1  # LeakyReLU, batch norm's epsilon and momentum (torch's)
CONV = ("NHWC", "OIHW", "NHWC")  # activations, torch's Conv2d weights, activations
TRANSPOSED = ("NHWC", "IOHW", "NHWC")  # torch's ConvTranspose2d weights (in, out, kh, kw)
# The transposed convolution's output row 2m + a takes input rows m - 1 and m (a = 0: kernel rows 3, 1) or
# m and m + 1 (a = 1: kernel rows 2, 0): per phase, the padding (before, after) and the two kernel taps.
PHASES = {0: ((1, 0), (3, 1)), 1: ((0, 1), (2, 0))}
STATS = ("running_mean", "running_var")


# -- the layers -----------------------------------------------------------------------------------
def conv(x: jax.Array, w: jax.Array, b: jax.Array | None, stride: int, pad: int) -> jax.Array:
    """torch's Conv2d on NHWC: x (B, H, W, I), w (O, I, k, k) -> (B, H', W', O)."""
    y = lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad), (pad, pad)], dimension_numbers=CONV)
    return y if b is None else y + b


def conv_transpose(x: jax.Array, w: jax.Array, b: jax.Array | None) -> jax.Array:
    """torch's ConvTranspose2d(k=4, s=2, p=1) on NHWC: x (B, H, W, I), w (I, O, 4, 4) -> (B, 2H, 2W, O), by phases."""
    batch, h, wd, _ = x.shape
    rows = []
    for a in (0, 1):
        cols = []
        for c in (0, 1):
            (pad_h, taps_h), (pad_w, taps_w) = PHASES[a], PHASES[c]
            kernel = w[:, :, list(taps_h)][:, :, :, list(taps_w)]  # (I, O, 2, 2)
            cols.append(lax.conv_general_dilated(x, kernel, (1, 1), [pad_h, pad_w], dimension_numbers=TRANSPOSED))
        rows.append(jnp.stack(cols, axis=3))  # (B, H, W, 2, O): column phase
    y = jnp.stack(rows, axis=2).reshape(batch, 2 * h, 2 * wd, w.shape[1])  # (B, H, 2, W, 2, O) -> (B, 2H, 2W, O)
    return y if b is None else y + b


def nearest_double(x: jax.Array) -> jax.Array:
    """(B, H, W, C) -> (B, 2H, 2W, C), each pixel repeated 2x2."""
    b, h, w, c = x.shape
    return jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, c)).reshape(b, 2 * h, 2 * w, c)


def leaky(x: jax.Array) -> jax.Array:
    return jnp.where(x >= 0, x, SLOPE * x)


def norm(kind: str, params: dict, stats: dict, name: str, x: jax.Array, train: bool, new_stats: dict) -> jax.Array:
    """Batch norm (training: the batch's statistics, the running ones moved into ``new_stats``; else the running
    ones) or instance norm (per sample and channel, no weights) over NHWC's channel axis."""
    if kind == "instance":
        mean = x.mean(axis=(1, 2), keepdims=True)
        return (x - mean) * lax.rsqrt(jnp.square(x - mean).mean(axis=(1, 2), keepdims=True) + EPS)
    if train:
        mean = x.mean(axis=(0, 1, 2))
        var = jnp.square(x - mean).mean(axis=(0, 1, 2))  # biased, for the normalisation
        n = x.size // x.shape[-1]
        kept = lax.stop_gradient
        new_stats[f"{name}.running_mean"] = (1 - MOMENTUM) * stats[f"{name}.running_mean"] + MOMENTUM * kept(mean)
        new_stats[f"{name}.running_var"] = (1 - MOMENTUM) * stats[f"{name}.running_var"] + MOMENTUM * kept(var) * n / max(n - 1, 1)
    else:
        mean, var = stats[f"{name}.running_mean"], stats[f"{name}.running_var"]
    return (x - mean) * lax.rsqrt(var + EPS) * params[f"{name}.weight"] + params[f"{name}.bias"]


# -- the networks' layers by their torch names ------------------------------------------------------
def generator_layers(cfg: NetConfig) -> list[tuple[str, str, tuple[int, ...], bool]]:
    """(name, kind, weight shape, has a bias) of the U-Net's convolutions and norms, in the torch module's order."""
    depth, widths = cfg.generator_depth, cfg.generator_widths()
    bias = cfg.norm == "instance"
    layers = []
    for i in range(depth):
        cin = cfg.in_channels if i == 0 else widths[i - 1]
        layers.append(("down.0" if i == 0 else f"down.{i}.1", "conv", (widths[i], cin, 4, 4), bias))
        if 0 < i < depth - 1:
            layers.append((f"down.{i}.2", "norm", (widths[i],), False))
    for i in range(depth):
        cin = widths[i] if i == depth - 1 else 2 * widths[i]
        cout = cfg.out_channels if i == 0 else widths[i - 1]
        if cfg.upsample == "transpose":
            layers.append((f"up.{i}.1", "transpose", (cin, cout, 4, 4), i == 0 or bias))
        else:
            layers.append((f"up.{i}.1.1", "conv", (cout, cin, 3, 3), i == 0 or bias))
        if i > 0:
            layers.append((f"up.{i}.2", "norm", (cout,), False))
    return layers


def discriminator_layers(cfg: NetConfig) -> list[tuple[str, str, tuple[int, ...], bool]]:
    """(name, kind, weight shape, has a bias) of the PatchGAN's layers, in the torch module's order."""
    layers = [("net.0", "conv", (cfg.ndf, cfg.in_channels + cfg.out_channels, 4, 4), True)]
    width, index = cfg.ndf, 2
    for n in range(1, cfg.d_layers + 1):
        prev, width = width, cfg.ndf * min(2**n, 8)
        layers += [(f"net.{index}", "conv", (width, prev, 4, 4), cfg.norm == "instance"), (f"net.{index + 1}", "norm", (width,), False)]
        index += 3
    return layers + [(f"net.{index}", "conv", (1, width, 4, 4), True)]


def initial_state(layers, norm_kind: str, rng: np.random.Generator) -> tuple[dict, dict]:
    """(params, stats) as numpy arrays: pix2pix's initialisation, N(0, 0.02) kernels, zero biases, batch norm
    scales N(1, 0.02) and zero shifts, running mean 0 and variance 1 (torch's, drawn from ``rng``)."""
    params, stats = {}, {}
    for name, kind, shape, bias in layers:
        if kind == "norm":
            if norm_kind == "batch":
                params[f"{name}.weight"] = rng.normal(1.0, 0.02, shape).astype(np.float32)
                params[f"{name}.bias"] = np.zeros(shape, np.float32)
                stats[f"{name}.running_mean"], stats[f"{name}.running_var"] = np.zeros(shape, np.float32), np.ones(shape, np.float32)
            continue
        params[f"{name}.weight"] = rng.normal(0.0, 0.02, shape).astype(np.float32)
        if bias:
            params[f"{name}.bias"] = np.zeros(shape[1] if kind == "transpose" else shape[0], np.float32)
    return params, stats


def split_state(state: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """A torch state dict's arrays -> (params, stats); batch norm's step counter is left out (momentum is fixed)."""
    params = {k: np.asarray(v, np.float32) for k, v in state.items() if not k.endswith(STATS + ("num_batches_tracked",))}
    stats = {k: np.asarray(v, np.float32) for k, v in state.items() if k.endswith(STATS)}
    return params, stats


def generator(cfg: NetConfig, params: dict, stats: dict, x: jax.Array, train: bool = False,
              key: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """The U-Net: x (B, H, W, in_channels) -> ((B, H, W, out_channels), the new running stats). ``train``: batch
    statistics, and dropout drawn from ``key`` where the config has it (None: no dropout)."""
    depth = cfg.generator_depth
    new_stats = dict(stats)
    layer = {name: (kind, bias) for name, kind, _, bias in generator_layers(cfg)}

    def apply(name: str, h: jax.Array, stride: int = 2, pad: int = 1) -> jax.Array:
        kind, bias = layer[name]
        b = params[f"{name}.bias"] if bias else None
        if kind == "transpose":
            return conv_transpose(h, params[f"{name}.weight"], b)
        if name.startswith("up."):  # resize: nearest doubling, then a 3x3 convolution
            return conv(nearest_double(h), params[f"{name}.weight"], b, 1, 1)
        return conv(h, params[f"{name}.weight"], b, stride, pad)

    skips, h = [], x  # skips[i]: (B, H / 2**(i+1), W / 2**(i+1), widths[i])
    for i in range(depth):
        h = apply("down.0" if i == 0 else f"down.{i}.1", h if i == 0 else leaky(h))
        if 0 < i < depth - 1:
            h = norm(cfg.norm, params, stats, f"down.{i}.2", h, train, new_stats)
        skips.append(h)
    dropout_levels = set(range(max(1, depth - 4), depth - 1))
    h = skips[-1]
    for i in range(depth - 1, -1, -1):
        if i < depth - 1:
            h = jnp.concatenate([skips[i], h], axis=-1)
        h = apply(f"up.{i}.1" if cfg.upsample == "transpose" else f"up.{i}.1.1", jax.nn.relu(h))
        if i == 0:
            h = jnp.tanh(h) if cfg.output == "tanh" else h
            continue
        h = norm(cfg.norm, params, stats, f"up.{i}.2", h, train, new_stats)
        if train and key is not None and i in dropout_levels and cfg.dropout > 0:
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 1 - cfg.dropout, h.shape)
            h = jnp.where(keep, h / (1 - cfg.dropout), 0.0)
    return h, new_stats


def discriminator(cfg: NetConfig, params: dict, stats: dict, condition: jax.Array, image: jax.Array,
                  train: bool = False) -> tuple[jax.Array, dict]:
    """PatchGAN: (condition (B, H, W, in), image (B, H, W, out)) -> ((B, h, w, 1) logits per patch, the new stats)."""
    new_stats = dict(stats)
    h = jnp.concatenate([condition, image], axis=-1)
    strides = iter([2] + [2 if n < cfg.d_layers else 1 for n in range(1, cfg.d_layers + 1)] + [1])  # of the convolutions, in order
    for name, kind, _, bias in discriminator_layers(cfg):
        if kind == "norm":
            h = leaky(norm(cfg.norm, params, stats, name, h, train, new_stats))
        else:
            h = conv(h, params[f"{name}.weight"], params[f"{name}.bias"] if bias else None, next(strides), 1)
            h = leaky(h) if name == "net.0" else h
    return h, new_stats


def infer(cfg: NetConfig, params: dict, stats: dict, x: jax.Array) -> jax.Array:
    """The generator in inference mode (running statistics, no dropout) on NCHW, as the data and rollouts hold
    frames: x (B, in_channels, H, W) -> (B, out_channels, H, W)."""
    out, _ = generator(cfg, params, stats, jnp.transpose(x, (0, 2, 3, 1)))
    return jnp.transpose(out, (0, 3, 1, 2))


def parameter_count(params: dict) -> int:
    return int(sum(np.prod(v.shape) for v in params.values()))
