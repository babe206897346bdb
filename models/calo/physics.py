"""Shower-shape metrics of calorimeter images (numpy): profiles, sampling fraction and resolution per energy and angle bin, the barycentre angle, and relative errors between two sets of metrics.

Images are (n, 51, 51, 25) cell energies in GeV, (x, y, z); energies in GeV, angles in degrees.
"""

import math

import numpy as np

ENERGY_EDGES = (100.0, 133.0, 166.0, 200.0)  # GeV: three bins of the study's 100-200 GeV
ANGLE_EDGES = (60.0, 80.0, 100.0, 120.0)  # degrees: three bins of the study's 60-120 degrees


def longitudinal_profile(cells: np.ndarray) -> np.ndarray:
    """Energy per layer (n, 25)."""
    return cells.sum(axis=(1, 2), dtype=np.float64)


def transverse_profiles(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Energy per x column (n, 51) and per y row (n, 51)."""
    return cells.sum(axis=(2, 3), dtype=np.float64), cells.sum(axis=(1, 3), dtype=np.float64)


def bins_of(values: np.ndarray, edges: tuple[float, ...]) -> np.ndarray:
    """Bin index of each value (0 .. len(edges) - 2; the last edge belongs to the last bin; -1 outside)."""
    idx = np.searchsorted(np.asarray(edges), values, side="right") - 1
    idx[np.asarray(values) == edges[-1]] = len(edges) - 2
    idx[(np.asarray(values) < edges[0]) | (np.asarray(values) > edges[-1])] = -1
    return idx


def shower_metrics(cells: np.ndarray, energy: np.ndarray, angle_deg: np.ndarray,
                   energy_edges: tuple[float, ...] = ENERGY_EDGES, angle_edges: tuple[float, ...] = ANGLE_EDGES) -> dict[str, np.ndarray]:
    """Per (energy bin, angle bin): events ``count`` (E, A); mean ``longitudinal`` (E, A, 25), ``x`` and ``y``
    (E, A, 51) profiles in GeV; ``sampling_fraction`` (E, A), the mean of sum / primary energy; ``resolution``
    (E, A), sigma / mean of that ratio. Empty bins hold NaN."""
    ie, ia = bins_of(energy, energy_edges), bins_of(angle_deg, angle_edges)
    ne, na = len(energy_edges) - 1, len(angle_edges) - 1
    long, (x, y) = longitudinal_profile(cells), transverse_profiles(cells)
    ratio = long.sum(axis=1) / np.asarray(energy, np.float64)
    out = {"count": np.zeros((ne, na), np.int64), "longitudinal": np.full((ne, na, cells.shape[3]), np.nan),
           "x": np.full((ne, na, cells.shape[1]), np.nan), "y": np.full((ne, na, cells.shape[2]), np.nan),
           "sampling_fraction": np.full((ne, na), np.nan), "resolution": np.full((ne, na), np.nan)}
    for e in range(ne):
        for a in range(na):
            members = (ie == e) & (ia == a)
            out["count"][e, a] = members.sum()
            if not members.any():
                continue
            out["longitudinal"][e, a], out["x"][e, a], out["y"][e, a] = long[members].mean(0), x[members].mean(0), y[members].mean(0)
            out["sampling_fraction"][e, a] = ratio[members].mean()
            out["resolution"][e, a] = ratio[members].std() / ratio[members].mean() if members.sum() > 1 else np.nan
    return out


def relative_errors(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], floor: float = 1e-3) -> dict[str, np.ndarray]:
    """(candidate - reference) / reference of every metric but ``count``, element by element (per layer,
    per column, per bin). Profile entries whose reference holds less than ``floor`` of its bin's total
    are NaN (a relative error of nearly nothing says nothing)."""
    out = {}
    for key, ref in reference.items():
        if key == "count":
            continue
        ref = np.asarray(ref, np.float64)
        err = (np.asarray(candidate[key], np.float64) - ref) / np.where(ref == 0, np.nan, ref)
        if ref.ndim == 3:
            err[ref < floor * ref.sum(axis=-1, keepdims=True)] = np.nan
        out[key] = err
    return out


def barycentre_angle(cells: np.ndarray, cell: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> np.ndarray:
    """The incidence angle (radians) measured from an image as the published discriminator's angle head
    measures it: the slope of each layer's y barycentre against depth, seen from the whole shower's
    barycentre, turned into an angle per layer and averaged with weights of the layer index; 100 for an
    empty image. A cell spans ``cell`` (x, y, z) units (unit steps on the published grid)."""
    n, nx, ny, nz = cells.shape
    c = cells.astype(np.float64)
    total = c.sum(axis=(1, 2, 3))  # (n,)
    xs, ys, zs = ((np.arange(m) + 0.5) * w for m, w in zip((nx, ny, nz), cell))
    safe = np.where(total == 0, 1.0, total)
    x_ref = np.where(total == 0, 1.0, c.sum(axis=(2, 3)) @ xs / safe)[:, None]
    y_ref = np.where(total == 0, 1.0, c.sum(axis=(1, 3)) @ ys / safe)[:, None]
    z_ref = np.where(total == 0, 1.0, c.sum(axis=(1, 2)) @ zs / safe)[:, None]
    per_layer = c.sum(axis=(1, 2))  # (n, nz)
    safe_layer = np.where(per_layer == 0, 1.0, per_layer)
    x_mid = np.where(per_layer == 0, 0.0, np.einsum("nxz,x->nz", c.sum(axis=2), xs) / safe_layer)
    y_mid = np.where(per_layer == 0, 0.0, np.einsum("nyz,y->nz", c.sum(axis=1), ys) / safe_layer)
    z = zs[None, :]
    proj = np.sqrt(np.maximum((x_mid - x_ref) ** 2 + (z - z_ref) ** 2, 1e-7))
    slope = (y_mid - y_ref) / proj
    slope = np.where(z < z_ref, -slope, slope)
    mask = (per_layer != 0).astype(np.float64)
    ang = (math.pi / 2 - np.arctan(slope)) * mask * z
    return np.where(total == 0, 100.0, ang.sum(axis=1) / (z * mask).sum(axis=1).clip(1e-300))
