"""Shapes and widths of the Pix2Pix networks, framework-free: the flow process plans with it without importing torch."""

import math
from dataclasses import dataclass
from typing import Literal

Norm = Literal["batch", "instance"]


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
