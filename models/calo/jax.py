"""The 3DGAN's networks in JAX (channels last): the generator and discriminator as pure functions of nets.py's weights, their batch norms and weightless heads (the trainer is tasks.workloads.calo.jax).

The weightless heads and (on a CPU) the batch norms' moments are taken in float64, as torch and Keras take them:
jax computes in float64 only with x64 enabled, which the trainer turns on in its process; every array of the
networks keeps its float32 dtype explicitly.
"""

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models.calo.nets import BN_EPSILON, BN_MOMENTUM, LEAKY_SLOPE, POWER, NetConfig, discriminator_convs, generator_convs, seed_channels

DIMENSIONS = ("NDHWC", "DHWIO", "NDHWC")  # features (B, z, x, y, C), kernels (z, x, y, in, out), features
PLANES = ("NHWC", "HWIO", "NHWC")  # conv's folded form: (B * z, x, y, kz * C) planes
MOVING = ("moving_mean", "moving_variance")


def split(weights: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """nets.py's weights of one network -> (trainable weights, batch-norm moving statistics)."""
    stats = {k: v for k, v in weights.items() if k.endswith(MOVING)}
    return {k: v for k, v in weights.items() if k not in stats}, stats


def upsample(x: jax.Array, factors: tuple[int, int, int]) -> jax.Array:
    """Nearest upsampling of (B, z, x, y, C) by whole (x, y, z) ``factors``: each cell repeated, through a broadcast (its gradient a sum)."""
    b, nz, nx, ny, c = x.shape
    fx, fy, fz = factors
    x = jnp.broadcast_to(x[:, :, None, :, None, :, None, :], (b, nz, fz, nx, fx, ny, fy, c))
    return x.reshape(b, nz * fz, nx * fx, ny * fy, c)


def conv(x: jax.Array, w: dict, c, folded: bool) -> jax.Array:
    """nets.py's convolution ``c`` with its zero padding, (B, z, x, y, cin) -> (B, z, x, y, cout) (depth first: see ``folded``).

    ``folded``: as one 2-D convolution over (x, y) of every output depth, its kernel's depth folded into the input
    channels (the kz shifted depth slices side by side), rather than XLA's 3-D convolution, which its CPU backend runs
    on a slow generic path (the whole step of the CPU network took several times as long with it on this project's
    2-core host). The same sums (tests/workloads/calo_step.py compares the two). Elsewhere the 3-D convolution itself."""
    kernel, bias = w[f"{c.name}/kernel"], w[f"{c.name}/bias"]  # (kx, ky, kz, cin, cout)
    (px, py, pz), (kx, ky, kz) = c.pad, c.kernel
    if not folded:
        return jax.lax.conv_general_dilated(x, kernel.transpose(2, 0, 1, 3, 4), (1, 1, 1), (pz, px, py), dimension_numbers=DIMENSIONS) + bias
    x = jnp.pad(x, ((0, 0), pz, (0, 0), (0, 0), (0, 0)))
    b, nz, nx, ny, cin = x.shape
    oz = nz - kz + 1
    stacked = jnp.concatenate([x[:, j: j + oz] for j in range(kz)], axis=-1).reshape(b * oz, nx, ny, kz * cin)  # channels (depth, cin)
    y = jax.lax.conv_general_dilated(stacked, kernel.reshape(kx, ky, kz * cin, c.cout), (1, 1), (px, py), dimension_numbers=PLANES)
    return y.reshape(b, oz, *y.shape[1:]) + bias


def batch_norm(x: jax.Array, w: dict, stats: dict, name: str, train: bool, moments, found: dict) -> jax.Array:
    """Keras' batch normalisation over (B, x, y, z, C): in training the batch's mean and biased variance (in
    ``moments``' dtype), which go into ``found`` under ``name`` for the caller to move the statistics by; else the
    moving statistics."""
    if train:
        wide = x.astype(jnp.promote_types(x.dtype, moments))
        mean = wide.mean(axis=(0, 1, 2, 3))
        var = jnp.square(wide - mean).mean(axis=(0, 1, 2, 3))
        found[name] = (mean.astype(x.dtype), var.astype(x.dtype))
        mean, var = mean.astype(x.dtype), var.astype(x.dtype)
    else:
        mean, var = stats[f"{name}/moving_mean"], stats[f"{name}/moving_variance"]
    scale = jax.lax.rsqrt(var + BN_EPSILON) * w[f"{name}/gamma"]
    return x * scale + (w[f"{name}/beta"] - mean * scale)


def moved(stats: dict, found: dict, momentum: float = BN_MOMENTUM, rest: float | None = None) -> dict:
    """The moving statistics after a training-mode pass whose batch moments are ``found``: ``momentum`` of the old and
    ``rest`` (1 - momentum unless given, as a traced momentum's complement computed outside) of the batch's."""
    out, rest = dict(stats), 1.0 - momentum if rest is None else rest
    for name, (mean, var) in found.items():
        out[f"{name}/moving_mean"] = momentum * stats[f"{name}/moving_mean"] + rest * mean
        out[f"{name}/moving_variance"] = momentum * stats[f"{name}/moving_variance"] + rest * var
    return out


@dataclass(frozen=True)
class Net:
    """How this module computes a configuration's networks: ``moments``, the batch norms' moments' dtype in training
    (float64 on a CPU, as torch's BatchNorm); ``folded``, conv's folded form (on a CPU)."""

    cfg: NetConfig
    moments: Any = jnp.float32
    folded: bool = True


def generator(net: Net, w: dict, stats: dict, z: jax.Array, train: bool) -> tuple[jax.Array, dict]:
    """Latent (B, latent) -> (images (B, *cfg.image, 1), each batch norm's batch moments in training, else none)."""
    cfg, found = net.cfg, {}
    x = (z @ w["dense/kernel"] + w["dense/bias"]).reshape(-1, *cfg.seed_grid, seed_channels(cfg))  # (B, 9, 9, 8, c0) in (x, y, z, c) order
    x = upsample(x.transpose(0, 3, 1, 2, 4), cfg.upsample)  # (B, 48, 54, 54, c0): depth first
    for c in generator_convs(cfg):
        x = jax.nn.relu(conv(x, w, c, net.folded))
        if c.bn:
            x = batch_norm(x, w, stats, f"{c.name}_bn", train, net.moments, found)
    x = x.transpose(0, 2, 3, 1, 4)  # (B, 51, 51, 25, 1)
    if cfg.energy_scaled:  # deposits^POWER of a 100 GeV shower, scaled to the primary's energy (E / 100 GeV, the first input)
        x = x * jnp.power(jnp.maximum(z[:, :1], 0.0), POWER)[:, None, None, None, :]
    return x, found


def ecal_sum(image: jax.Array) -> jax.Array:
    """(B, 51, 51, 25) -> (B, 1): the deposits' sum."""
    return image.sum(axis=(1, 2, 3))[:, None]


def barycentre_angle(image: jax.Array, cell: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> jax.Array:
    """(B, 51, 51, 25) -> (B, 1) radians: physics.barycentre_angle, the published angle head (cells of ``cell`` extent; torch.py's formula)."""
    nx, ny, nz = image.shape[1:]
    xs, ys, zs = ((jnp.arange(n, dtype=image.dtype) + 0.5) * c for n, c in zip((nx, ny, nz), cell))
    total = image.sum(axis=(1, 2, 3))
    empty = total == 0
    safe = jnp.where(empty, 1.0, total)
    x_ref = jnp.where(empty, 1.0, image.sum(axis=(2, 3)) @ xs / safe)[:, None]
    y_ref = jnp.where(empty, 1.0, image.sum(axis=(1, 3)) @ ys / safe)[:, None]
    z_ref = jnp.where(empty, 1.0, image.sum(axis=(1, 2)) @ zs / safe)[:, None]
    per_layer = image.sum(axis=(1, 2))  # (B, nz)
    layer_empty = per_layer == 0
    safe_layer = jnp.where(layer_empty, 1.0, per_layer)
    x_mid = jnp.where(layer_empty, 0.0, jnp.einsum("bxz,x->bz", image.sum(axis=2), xs) / safe_layer)
    y_mid = jnp.where(layer_empty, 0.0, jnp.einsum("byz,y->bz", image.sum(axis=1), ys) / safe_layer)
    z = zs[None, :]
    proj = jnp.sqrt(jnp.maximum((x_mid - x_ref) ** 2 + (z - z_ref) ** 2, 1e-7))
    slope = (y_mid - y_ref) / proj
    slope = jnp.where(z < z_ref, -slope, slope)
    mask = (~layer_empty).astype(image.dtype)
    ang = (math.pi / 2 - jnp.arctan(slope)) * mask * z
    measured = ang.sum(axis=1) / jnp.maximum((z * mask).sum(axis=1), 1e-30)
    return jnp.where(empty, 100.0, measured)[:, None]


def discriminator(net: Net, w: dict, stats: dict, image: jax.Array, train: bool, key=None):
    """Images (B, *cfg.image, 1) as deposits^POWER -> ((real/fake probability, energy / 100 GeV, angle, deposit sum),
    each (B, 1); each batch norm's batch moments in training). Dropout (cfg.dropout, from ``key``) in training only."""
    cfg, found = net.cfg, {}
    x = image.transpose(0, 3, 1, 2, 4)  # (B, 25, 51, 51, 1): depth first
    for i, c in enumerate(discriminator_convs(cfg)):
        x = jax.nn.leaky_relu(conv(x, w, c, net.folded), LEAKY_SLOPE)
        if c.bn:
            x = batch_norm(x, w, stats, f"{c.name}_bn", train, net.moments, found)
        if train and cfg.dropout > 0:
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 1.0 - cfg.dropout, x.shape)
            x = jnp.where(keep, x / (1.0 - cfg.dropout), 0.0).astype(x.dtype)
    b, nz, nx, ny, ch = x.shape  # average pool 2 (an odd last cell dropped), flattened in (x, y, z, c) order
    x = x[:, : nz // 2 * 2, : nx // 2 * 2, : ny // 2 * 2].reshape(b, nz // 2, 2, nx // 2, 2, ny // 2, 2, ch).mean(axis=(2, 4, 6))
    x = x.transpose(0, 2, 3, 1, 4).reshape(b, -1)
    fake = jax.nn.sigmoid(x @ w["fake/kernel"] + w["fake/bias"])
    aux = x @ w["aux/kernel"] + w["aux/bias"]
    deposits = jnp.power(image[..., 0].astype(jnp.float64), 1.0 / POWER)  # the weightless heads in float64: the angle's slopes are ill-conditioned in float32
    return (fake, aux, barycentre_angle(deposits, cfg.cell).astype(x.dtype), ecal_sum(deposits).astype(x.dtype)), found
