"""The 3DGAN's networks in PyTorch: the generator and discriminator layer by layer as nets.py describes them, their weights in its one layout, and the step's convolutions over runs of depths on a GPU (the trainer is tasks.workloads.calo.torch)."""

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.calo.nets import (BN_EPSILON, BN_MOMENTUM, LEAKY_SLOPE, POWER, NetConfig, discriminator_convs, flat_features,
                              generator_convs, seed_channels)

# device kind -> (depth_blocks' depths per plane, its planes channels-last) for the step's convolutions; (0, False): torch's
# 3-D convolution (the CPU's, and any kind not named). On an H200 at the published size and batch 32 (docs/accelerator.md),
# blocks of 8 depths ran the step 3.8x faster than cuDNN's 3-D convolutions in fp32 and 2.1x in bf16; channels-last
# planes 13 % faster again in bf16; blocks of 4 5 % faster than 8 and blocks of 16 12 % slower (bf16, planes not
# channels-last), and at batch 128 16 was 5 % slower than 8.
DEPTH_BLOCKS: dict[str, tuple[int, bool]] = {"cuda": (8, True)}


def _pad(conv) -> tuple[int, ...]:
    """nets.py's (before, after) per (x, y, z) as F.pad wants it: last axis first."""
    return tuple(p for axis in reversed(conv.pad) for p in axis)


def upsample(x: torch.Tensor, factors: tuple[int, int, int]) -> torch.Tensor:
    """Nearest upsampling of (B, C, x, y, z) by whole ``factors``: each cell repeated, as F.interpolate's nearest
    mode, through a broadcast view whose backward is a plain sum (interpolate's backward on a GPU adds with atomics)."""
    b, c, nx, ny, nz = x.shape
    fx, fy, fz = factors
    return x[:, :, :, None, :, None, :, None].expand(b, c, nx, fx, ny, fy, nz, fz).reshape(b, c, nx * fx, ny * fy, nz * fz)


@functools.lru_cache(maxsize=64)
def _depth_shifts(block: int, depth: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(block, block + depth - 1, depth) zeros but [o, o + k, k] = 1: output depth o of a block reads input depth o + k
    through the kernel's depth k (made once per shape, device and dtype)."""
    eye = torch.zeros(block, block + depth - 1, depth, dtype=dtype)
    for k in range(depth):
        eye[torch.arange(block), torch.arange(block) + k, k] = 1.0
    return eye.to(device)


def depth_blocks(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, block: int, channels_last: bool = False) -> torch.Tensor:
    """F.conv3d(x, weight, bias) (stride 1, no padding) of x (B, C, x, y, z) as one 2-D convolution over (x, y): each
    run of ``block`` output depths is one plane whose input channels are its ``block + kz - 1`` input depths times C and
    whose output channels are the ``block`` depths times C_out, through a kernel banded in depth (the 3-D kernel's
    depth slices on its diagonals, zeros elsewhere).

    The same sums, with (block + kz - 1) / kz times the multiplications, most by zero: the published network's
    convolutions have 1 to 16 channels, which leave a GPU's matrix units almost idle (cuDNN's 3-D kernels fill
    tiles of 64 or more channels with 8); banded, they see block x C_out output channels and (block + kz - 1) x C
    input channels. The last block is completed with zero depths and its extra outputs dropped. ``channels_last``:
    the planes in channels-last memory (cuDNN's tensor-core layout)."""
    b, c, nx, ny, nz = x.shape
    cout, cin, kx, ky, kz = weight.shape
    oz = nz - kz + 1
    blocks = -(-oz // block)
    window = block + kz - 1
    if blocks * block + kz - 1 > nz:
        x = F.pad(x, (0, blocks * block + kz - 1 - nz))
    planes = x.unfold(4, window, block)  # (B, C, x, y, blocks, window)
    if channels_last:
        planes = planes.permute(0, 4, 2, 3, 1, 5).reshape(b * blocks, nx, ny, c * window).permute(0, 3, 1, 2)
    else:
        planes = planes.permute(0, 4, 1, 5, 2, 3).reshape(b * blocks, c * window, nx, ny)
    shifts = _depth_shifts(block, kz, weight.device, weight.dtype)
    banded = torch.einsum("oixyk,zwk->oziwxy", weight, shifts).reshape(cout * block, cin * window, kx, ky)
    out = F.conv2d(planes, banded, bias.repeat_interleave(block))  # (B * blocks, C_out * block, x', y')
    ox, oy = out.shape[2:]
    out = out.reshape(b, blocks, cout, block, ox, oy).permute(0, 2, 4, 5, 1, 3).reshape(b, cout, ox, oy, blocks * block)
    return out[..., :oz]


class BatchNorm(nn.Module):
    """Keras' batch normalisation over (B, C, x, y, z): the batch's mean and biased variance taken in float64 on a CPU
    (torch's own kernel there loses about 1e-3 of the normalised activations where a channel holds hundreds of
    thousands of values) and in float32 by torch.var_mean elsewhere (a CUDA GPU's kernel combines partial moments, which
    keeps float32's precision; float64 there halves the bandwidth of the step's widest tensors), moving statistics moved
    by ``momentum`` (nets.BN_MOMENTUM) with that variance. ``moments``: the moments' dtype, set by the trainer for its device."""

    def __init__(self, channels: int):
        super().__init__()
        self.momentum = BN_MOMENTUM
        self.moments = torch.float64
        self.weight, self.bias = nn.Parameter(torch.ones(channels)), nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            var, mean = torch.var_mean(x.to(torch.promote_types(x.dtype, self.moments)), dim=(0, 2, 3, 4), unbiased=False)
            with torch.no_grad():
                self.running_mean.mul_(self.momentum).add_((1.0 - self.momentum) * mean.to(self.running_mean.dtype))
                self.running_var.mul_(self.momentum).add_((1.0 - self.momentum) * var.to(self.running_var.dtype))
            mean, var = mean.to(x.dtype), var.to(x.dtype)
        else:
            mean, var = self.running_mean, self.running_var
        scale = torch.rsqrt(var + BN_EPSILON) * self.weight
        return x * scale.view(1, -1, 1, 1, 1) + (self.bias - mean * scale).view(1, -1, 1, 1, 1)


class _Layers(nn.Module):
    """Convolutions (and their batch norms) of nets.py's table; tensors (B, C, x, y, z)."""

    def __init__(self, convs):
        super().__init__()
        self.convs = convs
        self.conv = nn.ModuleDict({c.name: nn.Conv3d(c.cin, c.cout, c.kernel) for c in convs})
        self.bn = nn.ModuleDict({c.name: BatchNorm(c.cout) for c in convs if c.bn})
        self.depth_block = 0  # 0: torch's 3-D convolution; else depth_blocks' of that many depths (set by the trainer)
        self.channels_last = False  # depth_blocks' planes in channels-last memory

    def apply_conv(self, c, x: torch.Tensor) -> torch.Tensor:
        """Convolution ``c`` of nets.py's table on x (B, C, x, y, z), its zero padding included."""
        conv, x = self.conv[c.name], F.pad(x, _pad(c))
        if self.depth_block:
            return depth_blocks(x, conv.weight, conv.bias, self.depth_block, self.channels_last)
        return conv(x)

    def load(self, weights: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for c in self.convs:
                self.conv[c.name].weight.copy_(torch.from_numpy(weights[f"{c.name}/kernel"].transpose(4, 3, 0, 1, 2).copy()))
                self.conv[c.name].bias.copy_(torch.from_numpy(weights[f"{c.name}/bias"]))
                if c.bn:
                    bn = self.bn[c.name]
                    for attr, part in (("weight", "gamma"), ("bias", "beta"), ("running_mean", "moving_mean"), ("running_var", "moving_variance")):
                        getattr(bn, attr).copy_(torch.from_numpy(weights[f"{c.name}_bn/{part}"]))

    def dump(self) -> dict[str, np.ndarray]:
        out = {}
        for c in self.convs:
            out[f"{c.name}/kernel"] = self.conv[c.name].weight.detach().cpu().numpy().transpose(2, 3, 4, 1, 0).copy()
            out[f"{c.name}/bias"] = self.conv[c.name].bias.detach().cpu().numpy()
            if c.bn:
                bn = self.bn[c.name]
                for attr, part in (("weight", "gamma"), ("bias", "beta"), ("running_mean", "moving_mean"), ("running_var", "moving_variance")):
                    out[f"{c.name}_bn/{part}"] = getattr(bn, attr).detach().cpu().numpy().copy()
        return out


class Generator(nn.Module):
    """Latent (B, latent) -> images (B, 51, 51, 25, 1) (cfg.image), channels last as in Keras."""

    def __init__(self, cfg: NetConfig):
        super().__init__()
        self.cfg, self.c0 = cfg, seed_channels(cfg)
        self.dense = nn.Linear(cfg.latent, int(np.prod(cfg.seed_grid)) * self.c0)
        self.layers = _Layers(generator_convs(cfg))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.dense(z).view(-1, *self.cfg.seed_grid, self.c0).permute(0, 4, 1, 2, 3)  # (B, c0, 9, 9, 8) from (x, y, z, c) order
        x = upsample(x, self.cfg.upsample)  # (B, c0, 54, 54, 48)
        for c in self.layers.convs:
            x = F.relu(self.layers.apply_conv(c, x))
            if c.bn:
                x = self.layers.bn[c.name](x)
        if self.cfg.energy_scaled:  # deposits^POWER of a 100 GeV shower, scaled to the primary's energy (E / 100 GeV, the first input)
            x = x * z[:, :1].clamp(min=0.0).pow(POWER).view(-1, 1, 1, 1, 1)
        return x.permute(0, 2, 3, 4, 1)  # (B, 51, 51, 25, 1)

    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            self.dense.weight.copy_(torch.from_numpy(weights["dense/kernel"].T.copy()))
            self.dense.bias.copy_(torch.from_numpy(weights["dense/bias"]))
        self.layers.load(weights)

    def weights(self) -> dict[str, np.ndarray]:
        return {"dense/kernel": self.dense.weight.detach().cpu().numpy().T.copy(), "dense/bias": self.dense.bias.detach().cpu().numpy(),
                **self.layers.dump()}


def ecal_sum(image: torch.Tensor) -> torch.Tensor:
    """(B, 51, 51, 25) -> (B, 1): the deposits' sum."""
    return image.sum(dim=(1, 2, 3)).unsqueeze(1)


def barycentre_angle(image: torch.Tensor, cell: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> torch.Tensor:
    """(B, 51, 51, 25) -> (B, 1) radians: physics.barycentre_angle, the published angle head (cells of ``cell`` extent)."""
    nx, ny, nz = image.shape[1:]
    xs, ys, zs = ((torch.arange(n, dtype=image.dtype, device=image.device) + 0.5) * c for n, c in zip((nx, ny, nz), cell))
    total = image.sum(dim=(1, 2, 3))
    empty = total == 0
    safe = torch.where(empty, torch.ones_like(total), total)
    x_ref = torch.where(empty, torch.ones_like(total), image.sum(dim=(2, 3)) @ xs / safe)[:, None]
    y_ref = torch.where(empty, torch.ones_like(total), image.sum(dim=(1, 3)) @ ys / safe)[:, None]
    z_ref = torch.where(empty, torch.ones_like(total), image.sum(dim=(1, 2)) @ zs / safe)[:, None]
    per_layer = image.sum(dim=(1, 2))  # (B, nz)
    layer_empty = per_layer == 0
    safe_layer = torch.where(layer_empty, torch.ones_like(per_layer), per_layer)
    x_mid = torch.where(layer_empty, torch.zeros_like(per_layer), torch.einsum("bxz,x->bz", image.sum(dim=2), xs) / safe_layer)
    y_mid = torch.where(layer_empty, torch.zeros_like(per_layer), torch.einsum("byz,y->bz", image.sum(dim=1), ys) / safe_layer)
    z = zs[None, :]
    proj = torch.sqrt(torch.clamp((x_mid - x_ref) ** 2 + (z - z_ref) ** 2, min=1e-7))
    slope = (y_mid - y_ref) / proj
    slope = torch.where(z < z_ref, -slope, slope)
    mask = (~layer_empty).to(image.dtype)
    ang = (math.pi / 2 - torch.atan(slope)) * mask * z
    measured = ang.sum(dim=1) / torch.clamp((z * mask).sum(dim=1), min=1e-30)
    return torch.where(empty, torch.full_like(measured, 100.0), measured)[:, None]


class Discriminator(nn.Module):
    """Images (B, 51, 51, 25, 1) as deposits^POWER -> (real/fake probability, energy / 100 GeV, angle, deposit sum), each (B, 1)."""

    def __init__(self, cfg: NetConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = _Layers(discriminator_convs(cfg))
        self.fake, self.aux = nn.Linear(flat_features(cfg), 1), nn.Linear(flat_features(cfg), 1)

    def forward(self, image: torch.Tensor):
        x = image.permute(0, 4, 1, 2, 3)  # (B, 1, 51, 51, 25)
        for c in self.layers.convs:
            x = F.leaky_relu(self.layers.apply_conv(c, x), LEAKY_SLOPE)
            if c.bn:
                x = self.layers.bn[c.name](x)
            x = F.dropout(x, self.cfg.dropout, self.training)
        x = F.avg_pool3d(x, 2).permute(0, 2, 3, 4, 1).flatten(1)  # (B, features) in (x, y, z, c) order
        deposits = image[..., 0].double() ** (1.0 / POWER)  # the weightless heads in float64: the angle's slopes are ill-conditioned in float32
        return torch.sigmoid(self.fake(x)), self.aux(x), barycentre_angle(deposits, self.cfg.cell).to(x.dtype), ecal_sum(deposits).to(x.dtype)

    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for head in ("fake", "aux"):
                getattr(self, head).weight.copy_(torch.from_numpy(weights[f"{head}/kernel"].T.copy()))
                getattr(self, head).bias.copy_(torch.from_numpy(weights[f"{head}/bias"]))
        self.layers.load(weights)

    def weights(self) -> dict[str, np.ndarray]:
        out = self.layers.dump()
        for head in ("fake", "aux"):
            out[f"{head}/kernel"] = getattr(self, head).weight.detach().cpu().numpy().T.copy()
            out[f"{head}/bias"] = getattr(self, head).bias.detach().cpu().numpy()
        return out


def build_networks(cfg: NetConfig, weights: dict[str, dict[str, np.ndarray]] | None = None) -> tuple[Generator, Discriminator]:
    """The generator and discriminator of ``cfg``, with ``weights`` (nets.initial_weights' layout) if given."""
    g, d = Generator(cfg), Discriminator(cfg)
    if weights is not None:
        g.load_weights(weights["generator"])
        d.load_weights(weights["discriminator"])
    return g, d


def parameter_counts(g: nn.Module, d: nn.Module) -> dict[str, dict[str, int]]:
    """Trainable parameters and all weights (with batch-norm running statistics, not the batch counter) of each network."""
    out = {}
    for name, net in (("generator", g), ("discriminator", d)):
        trainable = sum(p.numel() for p in net.parameters())
        stats = sum(b.numel() for n, b in net.named_buffers() if n.endswith(("running_mean", "running_var")))
        out[name] = {"trainable": trainable, "total": trainable + stats}
    return out
