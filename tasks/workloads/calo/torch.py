"""The 3DGAN in PyTorch: the generator and discriminator layer by layer as nets.py describes them (weights in its one layout), and the trainer of the published four-tape step."""

import copy
import functools
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tasks.workloads.calo.nets import (BN_EPSILON, BN_MOMENTUM, LEAKY_SLOPE, LEARNING_RATE, LOSS_WEIGHTS, POWER, PROFILE_FLOOR, average_decay,
                                       NetConfig, discriminator_convs, flat_features, generator_convs, initial_weights, seed_channels)
from tasks.workloads.calo.workload import CaloData, CaloTrainer


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


EPSILON = 1e-7  # Keras' fuzz factor: the clip of the probabilities and the floor of the percentage errors' denominators


def weighted_loss(outputs, label: torch.Tensor, energy: torch.Tensor, angle: torch.Tensor, ecal: torch.Tensor) -> torch.Tensor:
    """The published loss of the discriminator's four heads, each (B, 1): 3 BCE(real/fake) + 0.1 MAPE(energy)
    + 25 MAE(angle) + 0.1 MAPE(deposit sum), with nets.LOSS_WEIGHTS."""
    p, e, a, s = (o.to(label.dtype) for o in outputs)  # fp32 (or the test's fp64) out of a bf16 autocast
    p = p.clamp(EPSILON, 1.0 - EPSILON)
    bce = -(label * torch.log(p) + (1.0 - label) * torch.log(1.0 - p)).mean()
    mape = lambda truth, pred: 100.0 * ((truth - pred).abs() / truth.abs().clamp(min=EPSILON)).mean()  # noqa: E731
    w = LOSS_WEIGHTS
    return w["real_fake"] * bce + w["energy"] * mape(energy, e) + w["angle"] * (angle - a).abs().mean() + w["ecal_sum"] * mape(ecal, s)


def profile_loss(fake: torch.Tensor, real: torch.Tensor, energy: torch.Tensor) -> torch.Tensor:
    """The generator's profile term (nets.py, ``profile``) of generated and real images (B, 51, 51, 25, 1) as
    deposits^POWER of the same conditions, energy labels (B, 1), in float64 like the weightless heads; the real side is data."""
    def layers(image: torch.Tensor) -> torch.Tensor:
        return image[..., 0].double().clamp(min=0.0).pow(1.0 / POWER).sum(dim=(1, 2))  # (B, nz)

    made, data = layers(fake), layers(real).detach()
    made_sum, data_sum = made.sum(dim=1, keepdim=True).clamp(min=1e-30), data.sum(dim=1, keepdim=True).clamp(min=1e-30)
    data_share = data / data_sum
    # per shower against the real one of its conditions: each layer's share of the sum, then the log of the sums' ratio
    diff = torch.cat([made / made_sum - data_share, (made_sum / data_sum).log()], dim=1)  # (B, nz + 1)
    scale = torch.cat([data_share.mean(dim=0).clamp(min=PROFILE_FLOOR), data_share.new_ones(1)])
    c = energy.double().reshape(-1, 1)
    c = c - c.mean()  # the batch's energies about their mean
    level, slope = diff.mean(dim=0), (c * diff).mean(dim=0) / c.pow(2).mean().sqrt().clamp(min=1e-12)
    return ((level ** 2 + slope ** 2) / scale ** 2).mean().to(fake.dtype)


class RMSprop:
    """Keras' RMSprop (no momentum, not centred): v = rho v + (1 - rho) g^2; w -= lr g / sqrt(v + epsilon)."""

    def __init__(self, params, lr: float = LEARNING_RATE, rho: float = 0.9, epsilon: float = EPSILON):
        self.params, self.lr, self.rho, self.epsilon = list(params), lr, rho, epsilon
        self.velocity = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p, v in zip(self.params, self.velocity):
            v.mul_(self.rho).addcmul_(p.grad, p.grad, value=1.0 - self.rho)
            p.sub_(self.lr * p.grad / (v + self.epsilon).sqrt())

    def state_dict(self) -> dict:
        return {"velocity": list(self.velocity)}

    def load_state_dict(self, state: dict) -> None:
        for v, saved in zip(self.velocity, state["velocity"]):
            v.copy_(saved)


class CaloTorch(CaloTrainer):
    framework = "torch"

    def __init__(self, data: CaloData, spec, batch_size: int, runtime, cfg: NetConfig | None = None):
        ctx = runtime.ctx
        super().__init__(data, spec, batch_size, cfg, ctx.rank, ctx.world_size if ctx.strategy == "ddp" else 1)  # this rank's share of each batch
        self.runtime = runtime
        self.g, self.d = build_networks(self.cfg, initial_weights(self.cfg, spec.seed))
        self.g.to(ctx.device), self.d.to(ctx.device)
        for bn in (m for net in (self.g, self.d) for m in net.modules() if isinstance(m, BatchNorm)):
            bn.moments = torch.float64 if ctx.kind == "cpu" else torch.float32  # see BatchNorm
        for layers in (self.g.layers, self.d.layers):
            layers.depth_block, layers.channels_last = DEPTH_BLOCKS.get(ctx.kind, (0, False))
        # the generator's moving average (nets.average_decay), which generates wherever the trainer's showers are scored
        self.g_avg = copy.deepcopy(self.g).requires_grad_(False).eval() if self.cfg.average else None
        self.averaged = 0
        self.opt_g, self.opt_d = RMSprop(self.g.parameters()), RMSprop(self.d.parameters())
        self.speed = {"threads": runtime.threads, "precision": spec.precision}
        self._sections: dict[str, float] | None = None
        self._last = 0.0

    def _device(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        dtype = self.d.fake.weight.dtype  # float32 (a float64 network in the tests)
        return {k: torch.from_numpy(v).to(self.runtime.ctx.device, dtype) for k, v in batch.items()}

    def _mark(self, section: str) -> None:
        """While step_shares times the step: the time since the last mark goes to ``section`` (the device waited for)."""
        if self._sections is not None:
            self.runtime.ctx.sync()
            now = time.perf_counter()
            self._sections[section] = self._sections.get(section, 0.0) + now - self._last
            self._last = now

    def _update(self, loss: torch.Tensor, opt: RMSprop) -> None:
        self._mark("forward")
        opt.zero_grad()
        loss.backward()
        self._mark("backward")
        if self.world > 1:
            self._mean_gradients(opt.params)
            self._mark("allreduce")
        opt.step()
        self._mark("optimizer")

    def _mean_gradients(self, params: list[torch.Tensor]) -> None:
        """Each gradient averaged over the ranks in one all-reduce (the ranks' shares are equal, so this is the
        gradient of the global batch's mean loss): every rank then takes the same optimiser step.

        Not DistributedDataParallel: a step calls D four times and G three, two of D's calls frozen inside G's
        updates, which DDP's one-forward-one-backward bookkeeping does not follow; and one explicit all-reduce per
        update is what the step's profile times apart (step_shares' ``allreduce``)."""
        grads = [p.grad for p in params]
        flat = self.runtime.ctx.mean_over_ranks(torch.cat([g.reshape(-1) for g in grads]))
        for g, mean in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(mean.view_as(g))

    def step(self, batch, flags: list[float], progress: float):
        """The four tapes: D on real images, D on generated ones (G in training mode, no gradient), then two
        generator updates through the frozen D (inference mode: batch norm from its moving statistics, no dropout)."""
        b, ctx = batch, self.runtime.ctx
        self.opt_g.lr = self.opt_d.lr = self.rate_at(progress)
        self.g.train(), self.d.train()
        with ctx.autocast():
            loss_real = weighted_loss(self.d(b["image"]), b["real_label"], b["energy"], b["angle"], b["ecal"])
        self._update(loss_real, self.opt_d)
        with torch.no_grad(), ctx.autocast():
            fake = self.g(b["latent"][0])  # (B, 51, 51, 25, 1)
        with ctx.autocast():
            loss_fake = weighted_loss(self.d(fake.to(b["image"].dtype)), b["fake_label"], b["energy"], b["angle"], b["ecal_fit"])
        self._update(loss_fake, self.opt_d)
        self.d.eval()
        self.d.requires_grad_(False)
        try:
            loss_g = []
            for latent in (b["latent"][1], b["latent"][2]):
                with ctx.autocast():
                    fake = self.g(latent)
                    loss = weighted_loss(self.d(fake), torch.ones_like(b["real_label"]), b["energy"], b["angle"], b["ecal_fit"])
                    loss_g.append(loss + self.cfg.profile * profile_loss(fake, b["image"], b["energy"]) if self.cfg.profile else loss)
                self._update(loss_g[-1], self.opt_g)
        finally:
            self.d.requires_grad_(True)
        self._average()
        self.calibrated = False
        ctx.step_end()
        losses = {"loss_d_real": loss_real.detach(), "loss_d_fake": loss_fake.detach(), "loss_g_first": loss_g[0].detach(),
                  "loss_g_second": loss_g[1].detach(), "loss_g": (loss_g[0].detach() + loss_g[1].detach()) / 2}
        return self.runtime.reduce(losses, flags)

    @torch.no_grad()
    def _average(self) -> None:
        if self.g_avg is None:
            return
        decay = average_decay(self.cfg, self.averaged)
        self.averaged += 1
        for avg, p in zip(self.g_avg.parameters(), self.g.parameters()):
            avg.lerp_(p, 1.0 - decay)
        for avg, b in zip(self.g_avg.buffers(), self.g.buffers()):
            avg.copy_(b)

    @torch.no_grad()
    def set_statistics(self, latents: list[np.ndarray]) -> None:
        """The averaged generator's moving statistics: the running mean of each calibration batch's moments (momentum
        n / (n + 1) at batch n), its forward passes in training mode."""
        g, dtype = self.g_avg, self.d.fake.weight.dtype
        norms = [m for m in g.modules() if isinstance(m, BatchNorm)]
        g.train()
        try:
            for n, latent in enumerate(latents):
                for bn in norms:
                    bn.momentum = n / (n + 1.0)
                with self.runtime.ctx.autocast():
                    g(torch.from_numpy(latent).to(self.runtime.ctx.device, dtype))
        finally:
            for bn in norms:
                bn.momentum = BN_MOMENTUM
            g.eval()

    @property
    def generator(self) -> Generator:
        """The generator that generates: the moving average where there is one."""
        return self.g if self.g_avg is None else self.g_avg

    @torch.no_grad()
    def generate_images(self, latent: np.ndarray) -> np.ndarray:
        g = self.generator
        was_training = g.training
        g.eval()
        try:
            with self.runtime.ctx.autocast():
                return g(torch.from_numpy(latent).to(self.runtime.ctx.device, self.d.fake.weight.dtype)).float().cpu().numpy()
        finally:
            g.train(was_training)

    def weights(self) -> dict[str, dict[str, np.ndarray]]:
        return {"generator": self.generator.weights(), "discriminator": self.d.weights()}

    def state(self) -> dict:
        state = {"g": self.g.state_dict(), "d": self.d.state_dict(), "opt_g": self.opt_g.state_dict(), "opt_d": self.opt_d.state_dict()}
        if self.g_avg is not None:
            state |= {"g_avg": self.g_avg.state_dict(), "averaged": self.averaged}
        return state

    def load_state(self, state: dict) -> None:
        self.g.load_state_dict(state["g"]), self.d.load_state_dict(state["d"])
        self.opt_g.load_state_dict(state["opt_g"]), self.opt_d.load_state_dict(state["opt_d"])
        if self.g_avg is not None:
            self.g_avg.load_state_dict(state["g_avg"])
            self.averaged = int(state["averaged"])
        self.calibrated = False


def step_shares(trainer: CaloTorch, steps: int = 3) -> dict[str, float]:
    """Where a step's time goes: the fractions of ``steps`` steps' wall time (after one warm-up step) spent on
    input (the numpy batch and its copy to the device), forward passes (with the losses), backward passes, the
    gradients' all-reduce (over DDP ranks only), optimizer updates and the rest (the losses read back), timed section by section with the device waited for at each boundary (which costs a
    little overlap on an accelerator), and the mean step time in seconds."""
    batches = trainer.batches(1, steps + 1)
    trainer.step(next(batches), [0.0] * 3, 0.0)
    trainer._sections = {}
    try:
        t0 = trainer._last = time.perf_counter()
        for _ in range(steps):
            batch = next(batches)
            trainer._mark("input")
            trainer.step(batch, [0.0] * 3, 0.0)
            trainer._mark("other")  # the losses read back, the runtime's agreement
        total = trainer._last - t0  # to the last mark: the sections add up to it exactly
        shares = {k: v / total for k, v in trainer._sections.items()}
    finally:
        trainer._sections = None
    return {**shares, "step_s": total / steps}


def build(data: CaloData, spec, batch_size: int, runtime) -> CaloTorch:
    return CaloTorch(data, spec, batch_size, runtime)
