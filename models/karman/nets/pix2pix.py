"""Pix2Pix networks: a U-Net generator and a PatchGAN discriminator (Isola et al., 2017).

The defaults are the paper's: log2(size) down-blocks, ngf = ndf = 64, three dropout decoder blocks,
tanh output, 70×70 PatchGAN with three strided layers. Width, depth and normalisation are options.
"""

import torch
import torch.nn.functional as F
from torch import nn

from models.karman.nets import winograd
from models.karman.nets.config import NetConfig, Norm


def _norm(kind: Norm, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "instance":
        return nn.InstanceNorm2d(channels, affine=False)
    raise ValueError(f"unknown norm {kind!r}; choose batch or instance")


class _SmallMapGemm:
    """Mixin for the U-Net's 4×4 stride-2 convolutions: on feature maps of at most ``gemm_max_side``
    pixels a side, compute the layer as one matrix product over unfolded patches instead of calling
    the convolution kernel. Same parameters and the same function (to float rounding); on CPU,
    oneDNN's kernels run such tiny maps (the U-Net's innermost 512-channel levels) at a few percent
    of peak. 0 (the default) disables it; see ``use_gemm_for_small_maps``."""

    gemm_max_side: int = 0

    def _use_gemm(self, x: torch.Tensor) -> bool:
        return 0 < max(x.shape[-2:]) <= self.gemm_max_side


class Down(_SmallMapGemm, nn.Conv2d):
    """Conv2d(k=4, s=2, p=1): (B, Cin, H, W) -> (B, Cout, H/2, W/2)."""

    def __init__(self, cin: int, cout: int, bias: bool):
        super().__init__(cin, cout, 4, stride=2, padding=1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._use_gemm(x):
            return super().forward(x)
        b, _, h, w = x.shape
        cols = F.unfold(x, 4, padding=1, stride=2)  # (B, Cin*16, H/2 * W/2)
        out = self.weight.reshape(self.out_channels, -1) @ cols  # (B, Cout, H/2 * W/2)
        if self.bias is not None:
            out = out + self.bias[:, None]
        return out.view(b, self.out_channels, h // 2, w // 2)


class Up(_SmallMapGemm, nn.ConvTranspose2d):
    """ConvTranspose2d(k=4, s=2, p=1): (B, Cin, H, W) -> (B, Cout, 2H, 2W)."""

    def __init__(self, cin: int, cout: int, bias: bool):
        super().__init__(cin, cout, 4, stride=2, padding=1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._use_gemm(x):
            return super().forward(x)
        b, c, h, w = x.shape
        cols = self.weight.reshape(c, -1).t() @ x.reshape(b, c, h * w)  # (B, Cout*16, H*W)
        out = F.fold(cols, (2 * h, 2 * w), 4, padding=1, stride=2)  # scatter-add of the patches
        if self.bias is not None:
            out = out + self.bias[:, None, None]
        return out


def broadcast_double(x: torch.Tensor) -> torch.Tensor:
    """Nearest-neighbour doubling, (B, C, H, W) -> (B, C, 2H, 2W), as a broadcast and a reshape: view operations
    that XLA compiles once (its upsampling kernel recompiled every epoch under SPMD)."""
    b, c, h, w = x.shape
    return x[:, :, :, None, :, None].expand(b, c, h, 2, w, 2).reshape(b, c, 2 * h, 2 * w)


class NearestDouble(nn.Module):
    """Nearest-neighbour doubling of height and width, (B, C, H, W) -> (B, C, 2H, 2W), the values of
    nn.Upsample(scale_factor=2, mode="nearest"): torch's own kernel on cpu and cuda, ``broadcast_double`` on an
    XLA device. On a CPU the broadcast's backward (a strided sum over the copies) costs several times the
    kernel's (docs/frameworks.md, bench-frameworks)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "xla":
            return broadcast_double(x)
        return F.interpolate(x, scale_factor=2, mode="nearest")


class ResizeUp(nn.Sequential):
    """Nearest-neighbour doubling, then Conv2d(k=3, s=1, p=1): (B, Cin, H, W) -> (B, Cout, 2H, 2W).
    Every output pixel sees the same number of kernel taps, so unlike a stride-2 transposed
    convolution it cannot leave a checkerboard in the output (Odena et al., 2016)."""

    def __init__(self, cin: int, cout: int, bias: bool):
        super().__init__(NearestDouble(), nn.Conv2d(cin, cout, 3, padding=1, bias=bias))


_UPSAMPLERS = {"transpose": Up, "resize": ResizeUp}


def _upsampler(name: str):
    try:
        return _UPSAMPLERS[name]
    except KeyError:
        raise ValueError(f"unknown upsampling {name!r}; choose one of {', '.join(sorted(_UPSAMPLERS))}") from None


def use_gemm_for_small_maps(net: nn.Module, max_side: int = 8) -> nn.Module:
    """Compute the U-Net's strided convolutions on maps of at most ``max_side`` pixels a side as
    matrix products (0 turns it off). A speed choice for CPUs; weights and outputs are unchanged."""
    for m in net.modules():
        if isinstance(m, _SmallMapGemm):
            m.gemm_max_side = max_side
    return net


class Conv(nn.Conv2d):
    """nn.Conv2d that can compute its 4×4 stride-1 form by Winograd's F(3×3, 4×4) on CPU (same
    parameters, the same function to float32 rounding, about half the time of oneDNN's direct
    kernel on an AVX2 CPU for the PatchGAN's 256 -> 512 layer). Off by default; see ``use_winograd``."""

    winograd: bool = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._kernel_cache = winograd.KernelCache()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.winograd and winograd.supports(self, x)):
            return super().forward(x)
        return winograd.conv4x4(x, self.weight, self.bias, self.padding, self._kernel_cache)


def use_winograd(net: nn.Module, min_channels: int = 64, enabled: bool = True) -> nn.Module:
    """Compute ``net``'s 4×4 stride-1 convolutions with at least ``min_channels`` input and output
    channels by Winograd's algorithm when they run on CPU in float32 (a speed choice; weights and
    outputs are unchanged). Narrower layers stay with the direct kernel, which suits them."""
    for m in net.modules():
        if isinstance(m, Conv):
            m.winograd = enabled and m.stride == (1, 1) and min(m.in_channels, m.out_channels) >= min_channels
    return net


class UNetGenerator(nn.Module):
    """Encoder-decoder with skip connections between mirrored levels."""

    def __init__(self, cfg: NetConfig):
        super().__init__()
        depth = cfg.generator_depth
        if depth < 2:
            raise ValueError(f"U-Net depth {depth} must be >= 2")
        bias = cfg.norm == "instance"  # batch norm has its own shift
        widths = [cfg.ngf * min(2**i, 8) for i in range(depth)]
        self.down = nn.ModuleList()
        for i in range(depth):
            cin = cfg.in_channels if i == 0 else widths[i - 1]
            conv = Down(cin, widths[i], bias)
            if i == 0:
                self.down.append(conv)
            elif i == depth - 1:  # innermost: no normalisation
                self.down.append(nn.Sequential(nn.LeakyReLU(0.2, True), conv))
            else:
                self.down.append(nn.Sequential(nn.LeakyReLU(0.2, True), conv, _norm(cfg.norm, widths[i])))
        up = _upsampler(cfg.upsample)
        if cfg.output not in ("tanh", "linear"):
            raise ValueError(f"unknown output activation {cfg.output!r}; choose tanh or linear")
        # Dropout sits in the three decoder blocks just outside the innermost one.
        dropout_levels = set(range(max(1, depth - 4), depth - 1))
        self.up = nn.ModuleList()
        for i in range(depth):
            cin = widths[i] if i == depth - 1 else 2 * widths[i]
            if i == 0:
                block = [nn.ReLU(True), up(cin, cfg.out_channels, True)] + ([nn.Tanh()] if cfg.output == "tanh" else [])
            else:
                block = [nn.ReLU(True), up(cin, widths[i - 1], bias)]
                block.append(_norm(cfg.norm, widths[i - 1]))
                if i in dropout_levels and cfg.dropout > 0:
                    block.append(nn.Dropout(cfg.dropout))
            self.up.append(nn.Sequential(*block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []  # skips[i]: (B, widths[i], H / 2**(i+1), W / 2**(i+1))
        h = x
        for block in self.down:
            h = block(h)
            skips.append(h)
        h = self.up[-1](skips[-1])
        for i in range(len(self.up) - 2, -1, -1):
            h = self.up[i](torch.cat([skips[i], h], dim=1))
        return h  # (B, out_channels, H, W); in [-1, 1] with the tanh output


class PatchDiscriminator(nn.Module):
    """PatchGAN: classifies overlapping patches of (condition, image) pairs as real or fake."""

    def __init__(self, cfg: NetConfig):
        super().__init__()
        bias = cfg.norm == "instance"
        cin = cfg.in_channels + cfg.out_channels
        layers: list[nn.Module] = [Conv(cin, cfg.ndf, 4, 2, 1), nn.LeakyReLU(0.2, True)]
        width = cfg.ndf
        for n in range(1, cfg.d_layers + 1):
            prev, width = width, cfg.ndf * min(2**n, 8)
            stride = 2 if n < cfg.d_layers else 1
            layers += [Conv(prev, width, 4, stride, 1, bias=bias), _norm(cfg.norm, width), nn.LeakyReLU(0.2, True)]
        layers.append(Conv(width, 1, 4, 1, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, condition: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([condition, image], dim=1))  # (B, 1, h, w) logits per patch


_GENERATORS = {"unet": UNetGenerator}
_DISCRIMINATORS = {"patchgan": PatchDiscriminator}


def _build(registry: dict, kind: str, name: str, cfg: NetConfig) -> nn.Module:
    try:
        cls = registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join(sorted(registry))}") from None
    net = cls(cfg)
    net.apply(_init_weights)
    return net


def _init_weights(m: nn.Module) -> None:
    # Pix2Pix initialisation: N(0, 0.02) for convolutions, N(1, 0.02) for batch-norm scales.
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(m.weight, 0.0, 0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.BatchNorm2d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def build_generator(cfg: NetConfig) -> nn.Module:
    return _build(_GENERATORS, "generator", cfg.generator, cfg)


def build_discriminator(cfg: NetConfig) -> nn.Module:
    return _build(_DISCRIMINATORS, "discriminator", cfg.discriminator, cfg)
