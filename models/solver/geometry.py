"""Channel geometry: obstacle shapes and the node-type mask."""

from dataclasses import dataclass
from typing import Literal

import numpy as np

from models.solver.lattice import FLUID, INLET, OUTLET, SOLID

Shape = Literal["circle", "square", "rectangle", "ellipse"]
SHAPES: tuple[str, ...] = ("circle", "square", "rectangle", "ellipse")


@dataclass(frozen=True)
class Obstacle:
    """An obstacle centred at (cx, cy) in lattice cells.

    ``size`` is the cross-stream extent (the diameter for a circle), the length scale of the
    Reynolds number; ``aspect`` is streamwise over cross-stream extent (rectangle, ellipse).
    """

    shape: Shape = "circle"
    cx: float = 24.0
    cy: float = 32.0
    size: float = 12.0
    aspect: float = 1.0

    @property
    def half_extents(self) -> tuple[float, float]:
        """Half extent in x (streamwise) and y (cross-stream)."""
        ax = self.aspect if self.shape in ("rectangle", "ellipse") else 1.0
        return 0.5 * self.size * ax, 0.5 * self.size

    def solid(self, ny: int, nx: int) -> np.ndarray:
        """Boolean mask (ny, nx) of the cells whose centres lie inside the obstacle."""
        y, x = np.mgrid[0:ny, 0:nx].astype(np.float64)
        hx, hy = self.half_extents
        dx, dy = (x - self.cx) / hx, (y - self.cy) / hy
        if self.shape in ("circle", "ellipse"):
            return dx * dx + dy * dy <= 1.0
        if self.shape in ("square", "rectangle"):
            return (np.abs(dx) <= 1.0) & (np.abs(dy) <= 1.0)
        raise ValueError(f"unknown obstacle shape {self.shape!r}; choose one of {', '.join(SHAPES)}")

    def check_fits(self, ny: int, nx: int) -> None:
        """Raise ValueError unless the obstacle lies inside the fluid, clear of walls, inlet and outlet."""
        if self.shape not in SHAPES:
            raise ValueError(f"unknown obstacle shape {self.shape!r}; choose one of {', '.join(SHAPES)}")
        if self.size < 2:
            raise ValueError(f"obstacle size {self.size:g} cells is too small; need at least 2 cells across")
        if self.aspect <= 0:
            raise ValueError(f"obstacle aspect {self.aspect:g} must be > 0")
        hx, hy = self.half_extents
        # Walls occupy rows 0 and ny-1, the inlet column 0 and the outlet column nx-1: keep one fluid cell
        # between them and the obstacle.
        if self.cy - hy <= 1.5 or self.cy + hy >= ny - 2.5:
            raise ValueError(
                f"obstacle spans y {self.cy - hy:g}..{self.cy + hy:g} but must lie strictly inside 2..{ny - 3}"
                f" (channel height {ny}): it touches or crosses a wall"
            )
        if self.cx - hx <= 1.5 or self.cx + hx >= nx - 2.5:
            raise ValueError(
                f"obstacle spans x {self.cx - hx:g}..{self.cx + hx:g} but must lie strictly inside 2..{nx - 3}"
                f" (channel length {nx}): it touches the inlet or outlet"
            )


def channel_nodes(ny: int, nx: int, obstacle: Obstacle | None) -> np.ndarray:
    """Node types (ny, nx) uint8 for a channel: walls top and bottom, inlet left, outlet right."""
    nodes = np.full((ny, nx), FLUID, dtype=np.uint8)
    nodes[:, 0] = INLET
    nodes[:, -1] = OUTLET
    nodes[0, :] = SOLID
    nodes[-1, :] = SOLID
    if obstacle is not None:
        nodes[obstacle.solid(ny, nx)] = SOLID
    return nodes
