"""Shapes and widths of the Pix2Pix networks, framework-free: the flow process plans with it without importing torch."""

import math
from dataclasses import dataclass
from typing import Literal

Norm = Literal["batch", "instance"]


def check_cuda_graph(choice: str, device: str) -> None:
    """ValueError when ``cuda_graph`` is forced on (``choice`` "on") for a device kind without CUDA: the one refusal of
    train, bench-quality and bench-train, and of the trainer's own options."""
    if choice == "on" and device != "cuda":
        raise ValueError(f"cuda_graph on records the step on a CUDA GPU; device {device!r} has none (choose auto or off)")


@dataclass(frozen=True)
class NetConfig:
    """Shapes and widths of the generator and discriminator."""

    in_channels: int = 4
    out_channels: int = 3
    size: int = 256  # side of the square training image; sets the default depth
    depth: int | None = None  # generator down-blocks; None = log2(size)
    ngf: int = 64
    ndf: int = 64
    d_layers: int = 3
    norm: Norm = "batch"
    dropout: float = 0.5
    upsample: str = "transpose"  # transpose (the paper's 4×4 stride-2 transposed convolutions) or resize
    output: str = "tanh"  # tanh (the paper's bounded output) or linear
    generator: str = "unet"
    discriminator: str = "patchgan"

    @property
    def generator_depth(self) -> int:
        return self.depth if self.depth is not None else int(math.log2(self.size))

    def check_image(self, height: int, width: int) -> None:
        """Raise ValueError unless an image of height × width passes through the U-Net."""
        unit = 2**self.generator_depth
        if height <= 0 or width <= 0 or height % unit or width % unit:
            raise ValueError(
                f"image size {height}x{width} does not fit a U-Net of depth {self.generator_depth}: "
                f"height and width must be positive multiples of {unit}"
            )

    def generator_widths(self) -> list[int]:
        """Channels of the U-Net's levels, outermost first."""
        return [self.ngf * min(2**i, 8) for i in range(self.generator_depth)]

    def weight_count(self) -> tuple[int, int]:
        """(generator, discriminator) parameters, counted from the shapes without building the networks."""
        widths, depth = self.generator_widths(), self.generator_depth
        bias = self.norm == "instance"
        norm = 0 if self.norm == "instance" else 2  # batch norm's scale and shift per channel
        k_up = 16 if self.upsample == "transpose" else 9
        g = 0
        for i in range(depth):
            cin = self.in_channels if i == 0 else widths[i - 1]
            g += cin * widths[i] * 16 + (widths[i] if bias else 0) + (norm * widths[i] if 0 < i < depth - 1 else 0)
            up_in = widths[i] if i == depth - 1 else 2 * widths[i]
            up_out = self.out_channels if i == 0 else widths[i - 1]
            g += up_in * up_out * k_up + (up_out if (i == 0 or bias) else 0) + (norm * up_out if i > 0 else 0)
        d, width = (self.in_channels + self.out_channels) * self.ndf * 16 + self.ndf, self.ndf
        for n in range(1, self.d_layers + 1):
            prev, width = width, self.ndf * min(2**n, 8)
            d += prev * width * 16 + (width if bias else 0) + norm * width
        d += width * 16 + 1
        return g, d

    def forward_flops(self, height: int, width: int) -> tuple[list[float], list[float]]:
        """Forward FLOPs of one sample (a multiply-add counts 2), layer by layer, first layer first:
        (generator, discriminator), counted from the shapes: a convolution costs 2·Cin·Cout·k² per
        output position, a transposed one the same per input position. Normalisation, activations and
        the loss are left out, as the frameworks' FLOP counters leave them out."""
        widths, depth = self.generator_widths(), self.generator_depth
        g_down, h, w = [], height, width
        for i in range(depth):  # Down: 4x4 stride 2, padding 1
            cin = self.in_channels if i == 0 else widths[i - 1]
            h, w = _conv_out(h, 4, 2), _conv_out(w, 4, 2)
            g_down.append(2.0 * cin * widths[i] * 16 * h * w)
        g_up = []
        for i in range(depth - 1, -1, -1):  # innermost first: each doubles (h, w) back
            cin = widths[i] if i == depth - 1 else 2 * widths[i]
            cout = self.out_channels if i == 0 else widths[i - 1]
            hi, wi = height // 2 ** (i + 1), width // 2 ** (i + 1)
            g_up.append(2.0 * cin * cout * (16 * hi * wi if self.upsample == "transpose" else 9 * 4 * hi * wi))
        d, h, w, width_d = [], height, width, self.ndf
        h, w = _conv_out(h, 4, 2), _conv_out(w, 4, 2)
        d.append(2.0 * (self.in_channels + self.out_channels) * self.ndf * 16 * h * w)
        for n in range(1, self.d_layers + 1):
            prev, width_d = width_d, self.ndf * min(2**n, 8)
            stride = 2 if n < self.d_layers else 1
            h, w = _conv_out(h, 4, stride), _conv_out(w, 4, stride)
            d.append(2.0 * prev * width_d * 16 * h * w)
        h, w = _conv_out(h, 4, 1), _conv_out(w, 4, 1)
        d.append(2.0 * width_d * 16 * h * w)
        return g_down + g_up, d

    def training_flops(self, height: int, width: int, unroll: int = 1, adversarial: bool = False) -> float:
        """FLOPs of one training step per sample (models.karman.nets.trainer's step, and the Keras one's): each of
        the ``unroll`` generator passes forward and back (the backward pass costs twice the forward,
        less the gradient of the first layer's input, which nothing asks for); with an ``adversarial``
        term, the discriminator forward and back on a real and a generated pair, then forward and back
        to its input for the generator's update (its weights take no gradient there)."""
        g, d = self.forward_flops(height, width)
        flops = unroll * (3 * sum(g) - g[0])
        if adversarial:
            flops += 2 * (3 * sum(d) - d[0]) + 2 * sum(d)
        return flops

    def training_bytes(self, batch: int, height: int, width: int, unroll: int = 1) -> int:
        """An estimate of the memory one training step takes in float32: weights, gradients, Adam's two
        moments and the optimiser's temporaries (20 bytes a parameter), and the generator's saved
        activations (every level's output, kept for the backward pass of each unrolled step, about five
        tensors a level). Measured on CPU, ngf 512 (1.4 G parameters) at batch 8 ran out of 24 GiB."""
        g, d = self.weight_count()
        pixels = batch * height * width
        activations = sum(w * pixels / 4 ** (i + 1) for i, w in enumerate(self.generator_widths())) * 2 * 5 * unroll
        return int(20 * (g + d) + 4 * activations)


def _conv_out(size: int, kernel: int, stride: int, padding: int = 1) -> int:
    """Output side of a convolution over ``size`` positions."""
    return (size + 2 * padding - kernel) // stride + 1
