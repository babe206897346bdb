"""Channel geometry: obstacle shapes, the node-type mask and the links that cross the obstacle's wall.

Node (y, x) sits at the centre of cell (y, x). Row 0 and row ny-1 are wall nodes (the no-slip walls lie
half-way, at y = 0.5 and y = ny - 1.5); column 0 and column nx-1 are ghost nodes of the inlet and the
outlet (the inflow plane lies at x = 0.5).
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np

from models.karman.solver.lattice import CX, CY, FLUID, INLET, OUTLET, SOLID

Shape = Literal["circle", "square", "rectangle", "ellipse"]
SHAPES: tuple[str, ...] = ("circle", "square", "rectangle", "ellipse")


@dataclass(frozen=True)
class Obstacle:
    """An obstacle centred at (cx, cy) in node coordinates.

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

    @property
    def rounded(self) -> bool:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown obstacle shape {self.shape!r}; choose one of {', '.join(SHAPES)}")
        return self.shape in ("circle", "ellipse")

    def contains(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """True where the point (x, y) lies inside the obstacle or on its surface."""
        hx, hy = self.half_extents
        dx, dy = (np.asarray(x) - self.cx) / hx, (np.asarray(y) - self.cy) / hy
        if self.rounded:
            return dx * dx + dy * dy <= 1.0
        return (np.abs(dx) <= 1.0) & (np.abs(dy) <= 1.0)

    def solid(self, ny: int, nx: int) -> np.ndarray:
        """Boolean mask (ny, nx) of the nodes inside the obstacle."""
        y, x = np.mgrid[0:ny, 0:nx].astype(np.float64)
        return self.contains(x, y)

    def wall_fraction(self, x: np.ndarray, y: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
        """Fraction q in (0, 1] of the link from outside point (x, y) to inside point (x+dx, y+dy) at
        which it meets the obstacle's surface (the distance used by interpolated bounce-back)."""
        hx, hy = self.half_extents
        px, py = (np.asarray(x, float) - self.cx) / hx, (np.asarray(y, float) - self.cy) / hy
        ex, ey = np.asarray(dx, float) / hx, np.asarray(dy, float) / hy
        if self.rounded:  # |p + q e|^2 = 1, the smaller root
            a = ex * ex + ey * ey
            b = 2 * (px * ex + py * ey)
            c = px * px + py * py - 1
            q = (-b - np.sqrt(np.maximum(b * b - 4 * a * c, 0))) / (2 * a)
        else:  # the link enters the box when it has entered both slabs
            with np.errstate(divide="ignore", invalid="ignore"):
                tx = np.where(ex != 0, np.minimum((-1 - px) / ex, (1 - px) / ex), -np.inf)
                ty = np.where(ey != 0, np.minimum((-1 - py) / ey, (1 - py) / ey), -np.inf)
            q = np.maximum(tx, ty)
        return np.clip(q, 1e-6, 1.0)

    def check_fits(self, ny: int, nx: int) -> None:
        """Raise ValueError unless the obstacle lies inside the fluid, clear of walls, inlet and outlet."""
        self.rounded  # noqa: B018 - validates the shape name
        if self.size < 2:
            raise ValueError(f"obstacle size {self.size:g} cells is too small; need at least 2 cells across")
        if self.aspect <= 0:
            raise ValueError(f"obstacle aspect {self.aspect:g} must be > 0")
        hx, hy = self.half_extents
        # Keep at least one full fluid node between the obstacle and the walls, inlet and outlet.
        if self.cy - hy <= 1.5 or self.cy + hy >= ny - 2.5:
            raise ValueError(
                f"obstacle spans y {self.cy - hy:g}..{self.cy + hy:g} but must lie strictly inside 1.5..{ny - 2.5:g}"
                f" (channel of {ny} rows): it touches or crosses a wall"
            )
        if self.cx - hx <= 1.5 or self.cx + hx >= nx - 2.5:
            raise ValueError(
                f"obstacle spans x {self.cx - hx:g}..{self.cx + hx:g} but must lie strictly inside 1.5..{nx - 2.5:g}"
                f" (channel of {nx} columns): it touches the inlet or outlet"
            )


def channel_nodes(ny: int, nx: int, obstacle: Obstacle | None, periodic: bool = False) -> np.ndarray:
    """Node types (ny, nx) uint8: walls top and bottom, inlet left, outlet right (all fluid if periodic,
    where the outer ring of nodes is a ghost copy of the opposite side)."""
    nodes = np.full((ny, nx), FLUID, dtype=np.uint8)
    if not periodic:
        nodes[:, 0] = INLET
        nodes[:, -1] = OUTLET
        nodes[0, :] = SOLID
        nodes[-1, :] = SOLID
    if obstacle is not None:
        nodes[obstacle.solid(ny, nx)] = SOLID
    return nodes


@dataclass(frozen=True)
class ObstacleLinks:
    """The obstacle's boundary, as the solver's operators need it.

    For every fluid node next to the obstacle (``cells``, (nb, 2) rows of (y, x)) and every direction i
    (9 columns), ``kind`` says how population i arrives: 0 streams from its neighbour, 1 bounces back off
    a channel wall half-way, 2 reflects off the obstacle with interpolated bounce-back
    f_i = a f*_opp(x) + b f*_opp(x + c_i) + c f*_i(x) (post-collision values ``f*``; Bouzidi's linear rule
    from the wall distance q). ``solid`` lists the obstacle's interior nodes, held at rest.
    """

    cells: np.ndarray  # (nb, 2) int64
    kind: np.ndarray  # (nb, 9) uint8
    coef: np.ndarray  # (nb, 9, 3) float64: a, b, c
    q: np.ndarray  # (nb, 9) float64, 0 where kind != 2
    solid: np.ndarray  # (ns, 2) int64


def obstacle_links(nodes: np.ndarray, obstacle: Obstacle | None, interpolated: bool = True) -> ObstacleLinks:
    """Links between the fluid and the obstacle; ``interpolated=False`` puts every wall half-way (q = 1/2)."""
    ny, nx = nodes.shape
    if obstacle is None:
        empty = np.zeros((0, 2), np.int64)
        return ObstacleLinks(empty, np.zeros((0, 9), np.uint8), np.zeros((0, 9, 3)), np.zeros((0, 9)), empty)
    body = obstacle.solid(ny, nx)
    fluid = nodes == FLUID
    near = np.zeros_like(body)
    for i in range(1, 9):  # population i arrives from x - c_i
        near |= fluid & np.roll(body, (CY[i], CX[i]), axis=(0, 1))
    ys, xs = np.nonzero(near)
    kind = np.zeros((len(ys), 9), np.uint8)
    coef = np.zeros((len(ys), 9, 3))
    q = np.zeros((len(ys), 9))
    for i in range(1, 9):
        sy, sx = (ys - CY[i]) % ny, (xs - CX[i]) % nx
        src = nodes[sy, sx]
        wall = (src == SOLID) & ~body[sy, sx]
        kind[wall, i] = 1
        hit = body[sy, sx]
        if not hit.any():
            continue
        # the link from x towards the wall runs along c_opp = -c_i
        qi = obstacle.wall_fraction(xs[hit], ys[hit], -CX[i], -CY[i]) if interpolated else np.full(hit.sum(), 0.5)
        behind = nodes[(ys[hit] + CY[i]) % ny, (xs[hit] + CX[i]) % nx] == FLUID
        near_wall = (qi < 0.5) & behind
        a = np.where(near_wall, 2 * qi, np.where(qi < 0.5, 1.0, 1 / (2 * qi)))
        b = np.where(near_wall, 1 - 2 * qi, 0.0)
        c = np.where(qi < 0.5, 0.0, (2 * qi - 1) / (2 * qi))
        kind[hit, i] = 2
        coef[hit, i] = np.stack([a, b, c], axis=1)
        q[hit, i] = qi
    solid = np.argwhere(body)
    return ObstacleLinks(np.stack([ys, xs], axis=1).astype(np.int64), kind, coef, q, solid.astype(np.int64))

