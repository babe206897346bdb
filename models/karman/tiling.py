"""Map-reduce tiling of a frame: split into overlapping tiles, pack them into fixed-shape groups, merge.

A frame (C, H, W) is covered by a grid of equal tiles (C, th, tw). Neighbouring tiles overlap by at
least ``2 * halo`` pixels, so every pixel lies at least ``halo`` pixels inside some tile: the tile
sees that much of its surroundings. Merging blends the tiles' outputs with weights that are zero in
the outer ``trim`` pixels of a tile's interior edges and rise linearly to one at ``halo`` pixels in;
sides on the frame's border keep full weight. The weights are normalised to sum to one at every
pixel, so a constant output merges to itself and no seam is left where tiles meet.

Exactness: if the network's output at a pixel depends only on inputs within ``r`` pixels (a finite
receptive field) and ``trim >= r``, the merged frame equals the full-frame output wherever the
tile offsets keep the network's stride grid (multiples of ``unit``): every weighted pixel was
computed with its whole receptive field inside the tile.

Pure numpy; the networks that map the tiles live elsewhere.
"""

import math
from dataclasses import dataclass, field

import numpy as np

DEFAULT_HALO = 8  # pixels a tile reaches into its neighbours, unless asked otherwise (infer and bench-infer)


class TilingError(ValueError):
    """A tiling that cannot cover the frame (tile larger than the frame, halo too wide, ...)."""


def _positions(length: int, tile: int, halo: int, unit: int, axis: str) -> list[int]:
    """Offsets of the fewest tiles of ``tile`` pixels covering ``length`` with overlaps of at least
    ``2 * halo``, spread evenly, on multiples of ``unit`` when the frame's length allows."""
    if tile > length:
        raise TilingError(f"tile {axis} {tile} is larger than the frame's {axis} {length}; choose a tile of at most {length}")
    if tile == length:
        return [0]
    if 2 * halo >= tile:
        raise TilingError(f"halo {halo} leaves no core in a tile {axis} of {tile}; the halo must be below {tile // 2} (half the tile)")
    span = length - tile  # the last tile ends on the frame's far edge
    first = max(2, math.ceil((length - 2 * halo) / (tile - 2 * halo)))
    for step in ((unit, 1) if length % unit == 0 and unit > 1 else (1,)):
        for n in range(first, span // step + 2):
            offsets = [int(round(i * span / (n - 1) / step)) * step for i in range(n)]
            overlaps = [a + tile - b for a, b in zip(offsets, offsets[1:])]
            if len(set(offsets)) == n and min(overlaps) >= 2 * halo:
                return offsets
    raise TilingError(f"no placement of {axis} {tile} tiles covers {length} with overlaps of 2 x halo {halo}")


def _edge_weights(tile: int, trim: int, halo: int, low_edge: bool, high_edge: bool) -> np.ndarray:
    """1-D blend weights (tile,): 1 inside, 0 over ``trim`` pixels at interior edges, linear to 1 at ``halo``."""
    d = np.arange(tile, dtype=np.float64)
    ramp = lambda dist: np.clip((dist - trim + 0.5) / max(halo - trim, 1), 0.0, 1.0)  # noqa: E731
    w = np.ones(tile)
    if low_edge:
        w = np.minimum(w, ramp(d))
    if high_edge:
        w = np.minimum(w, ramp(tile - 1 - d))
    return w


@dataclass(frozen=True)
class TilePlan:
    """Where the tiles of a (height, width) frame sit, and how their outputs are blended back.

    ``unit`` is the side every tile must be a multiple of (2**depth for a U-Net); ``trim`` defaults
    to half the halo.
    """

    height: int
    width: int
    tile: tuple[int, int]
    halo: int
    unit: int = 1
    trim: int | None = None
    rows: list[int] = field(init=False)
    cols: list[int] = field(init=False)

    def __post_init__(self):
        th, tw = self.tile
        if self.halo < 0:
            raise TilingError(f"halo {self.halo} is negative; use 0 or more pixels")
        for name, side in (("height", th), ("width", tw)):
            if side <= 0 or side % self.unit:
                raise TilingError(f"tile {name} {side} is not a positive multiple of {self.unit}, the network's stride unit")
        trim = self.halo // 2 if self.trim is None else self.trim
        if not 0 <= trim <= self.halo:
            raise TilingError(f"trim {trim} must lie between 0 and the halo {self.halo}")
        object.__setattr__(self, "trim", trim)
        object.__setattr__(self, "rows", _positions(self.height, th, self.halo, self.unit, "height"))
        object.__setattr__(self, "cols", _positions(self.width, tw, self.halo, self.unit, "width"))

    @property
    def count(self) -> int:
        return len(self.rows) * len(self.cols)

    @property
    def overhead(self) -> float:
        """Pixels computed over pixels in the frame (1.0 = no overlap)."""
        return self.count * self.tile[0] * self.tile[1] / (self.height * self.width)

    def offsets(self) -> list[tuple[int, int]]:
        """(row, col) of each tile's top-left corner, row-major."""
        return [(r, c) for r in self.rows for c in self.cols]

    def split(self, frame: np.ndarray) -> np.ndarray:
        """(..., C, H, W) -> tiles (N, ..., C, th, tw), copies in row-major tile order."""
        th, tw = self.tile
        if frame.shape[-2:] != (self.height, self.width):
            raise TilingError(f"frame of {frame.shape[-2]}x{frame.shape[-1]} given to a plan for {self.height}x{self.width}")
        return np.stack([frame[..., r : r + th, c : c + tw] for r, c in self.offsets()])

    def weights(self) -> np.ndarray:
        """Blend weights (N, th, tw) of each tile, normalised so they sum to 1 over the frame."""
        th, tw = self.tile
        wy = [_edge_weights(th, self.trim, self.halo, i > 0, i < len(self.rows) - 1) for i in range(len(self.rows))]
        wx = [_edge_weights(tw, self.trim, self.halo, j > 0, j < len(self.cols) - 1) for j in range(len(self.cols))]
        raw = np.stack([np.outer(a, b) for a in wy for b in wx])  # (N, th, tw)
        total = np.zeros((self.height, self.width))
        for w, (r, c) in zip(raw, self.offsets()):
            total[r : r + th, c : c + tw] += w
        return np.stack([w / total[r : r + th, c : c + tw] for w, (r, c) in zip(raw, self.offsets())])

    def merge(self, tiles: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """Tiles (N, ..., C, th, tw) -> frame (..., C, H, W), blended with ``weights`` (N, th, tw)."""
        weights = self.weights() if weights is None else weights
        th, tw = self.tile
        out = np.zeros(tiles.shape[1:-2] + (self.height, self.width), dtype=tiles.dtype)
        for t, w, (r, c) in zip(tiles, weights.astype(tiles.dtype), self.offsets()):
            out[..., r : r + th, c : c + tw] += t * w
        return out


def pack_groups(tiles: np.ndarray, group: int) -> tuple[np.ndarray, int]:
    """Tiles (N, C, h, w) -> groups (G, group, C, h, w), the last one padded with zeros so every group
    has the same shape (an XLA graph compiles once); returns the groups and N."""
    if group <= 0:
        raise TilingError(f"group size {group} must be at least 1 tile")
    n = len(tiles)
    count = math.ceil(n / group)
    padded = np.zeros((count * group,) + tiles.shape[1:], dtype=tiles.dtype)
    padded[:n] = tiles
    return padded.reshape((count, group) + tiles.shape[1:]), n


def unpack_groups(groups: np.ndarray, n: int) -> np.ndarray:
    """Inverse of ``pack_groups``: (G, group, ...) -> the first ``n`` tiles (n, ...)."""
    return groups.reshape((-1,) + groups.shape[2:])[:n]
