"""Synthetic electron showers (numpy): the GFlash parametrisation of Grindhammer & Peters, rotated by the incidence angle and binned to 51x51x25 calorimeter cells.

The model (all synthetic; no Geant4):

* Longitudinal: dE/dt = E f(t), f a gamma density in t (depth along the shower axis in radiation
  lengths X0), f(t) = beta (beta t)^(alpha-1) exp(-beta t) / Gamma(alpha), with T = (alpha-1)/beta the depth
  of the maximum. Per event, (ln T, ln alpha) are drawn from a correlated normal with the parameters of
  G. Grindhammer and S. Peters, "The parameterized simulation of electromagnetic showers in homogeneous
  and sampling calorimeters", Int. Conf. on Monte Carlo Simulation in High Energy and Nuclear Physics
  (1993), arXiv:hep-ex/0001020, homogeneous media, y = E / E_c:
  <ln T> = ln(ln y - 0.858), <ln alpha> = ln(0.21 + (0.492 + 2.38 / Z) ln y),
  sigma(ln T) = 1 / (-1.4 + 1.26 ln y), sigma(ln alpha) = 1 / (-0.58 + 0.86 ln y), rho = 0.705 - 0.023 ln y.
* Radial (same reference), r in Moliere radii R_M, tau = t / T:
  f(r) = p 2 r R_C^2 / (r^2 + R_C^2)^2 + (1 - p) 2 r R_T^2 / (r^2 + R_T^2)^2 (a core and a tail), with
  R_C = z1 + z2 tau, R_T = k1 (exp(k3 (tau - k2)) + exp(k4 (tau - k2))), p = p1 exp((p2 - tau) / p3 - exp((p2 - tau) / p3)),
  z1 = 0.0251 + 0.00319 ln E, z2 = 0.1162 - 0.000381 Z, k1 = 0.659 - 0.00309 Z, k2 = 0.645, k3 = -2.59,
  k4 = 0.3585 + 0.0421 ln E, p1 = 0.2632 - 0.00094 Z, p2 = 0.401 + 0.00187 Z, p3 = 1.313 - 0.0686 ln E (E in GeV).
* The medium: tungsten-like, Z = 74, E_c = 8.0 MeV, R_M / X0 = 2.66 (9.3 mm / 3.5 mm).
* Energy: the shower is cut into SPOTS_PER_GEV equal spots per GeV of primary energy (GFlash's spots),
  each placed at (t, r, phi) drawn from the profiles; the spots' total is the deposited energy
  E * SAMPLING_FRACTION * (1 + STOCHASTIC / sqrt(E / GeV) * N(0, 1)), a stand-in for the sampling
  fluctuations of a silicon-tungsten calorimeter (17 %/sqrt(E)). Spots outside the cells leak.
* Geometry: the axis lies in the (y, z) plane at the polar angle theta from the y axis (90 degrees:
  perpendicular to the layers; the study's angle range is 60 to 120 degrees), and crosses the middle of
  the x-y face at depth AXIS_DEPTH_X0. Cells: 51 x 51 in (x, y) by 25 layers (the 3DGAN images), cubes of
  1 X0 (0.376 R_M wide), so that an angle measured from the image in cell units (the discriminator's
  angle head) is the geometric angle; 25 X0 deep, 19 R_M wide.
"""

import math

import numpy as np

SHAPE = (51, 51, 25)  # (x, y, z) cells
Z_ATOMIC, CRITICAL_GEV = 74.0, 0.0080  # tungsten-like medium
RM_OVER_X0 = 2.66
CELL_X0 = LAYER_X0 = 1.0  # cell width and layer depth in radiation lengths
CELL_RM = CELL_X0 / RM_OVER_X0  # cell width in Moliere radii (0.376)
AXIS_DEPTH_X0 = 10.0  # the axis crosses the middle of the x-y face at this depth
SAMPLING_FRACTION = 0.02  # deposited / primary energy before leakage (the study's ECAL: about 2 %)
STOCHASTIC = 0.17  # relative spread of the deposited energy at 1 GeV, scaled by 1 / sqrt(E / GeV)
SPOTS_PER_GEV = 10
ENERGY_LIMITS = (10.0, 500.0)  # GeV: where the parametrisation is used here (25 X0 contain the showers)
ANGLE_LIMITS = (60.0, 120.0)  # degrees: the study's angle range; the grid holds the showers' spread at its ends


def longitudinal_parameters(energy: np.ndarray) -> dict[str, np.ndarray]:
    """Mean and spread of (ln T, ln alpha) and their correlation at primary energies ``energy`` (GeV)."""
    ln_y = np.log(np.asarray(energy, np.float64) / CRITICAL_GEV)
    return {"mean_ln_t": np.log(ln_y - 0.858), "mean_ln_alpha": np.log(0.21 + (0.492 + 2.38 / Z_ATOMIC) * ln_y),
            "sigma_ln_t": 1.0 / (-1.4 + 1.26 * ln_y), "sigma_ln_alpha": 1.0 / (-0.58 + 0.86 * ln_y), "rho": 0.705 - 0.023 * ln_y}


def draw_longitudinal(energy: np.ndarray, rng: np.random.Generator, fluctuate: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(T, alpha) of each event: drawn from the correlated log-normal, or the means' exponentials without fluctuations."""
    p = longitudinal_parameters(energy)
    if not fluctuate:
        return np.exp(p["mean_ln_t"]), np.exp(p["mean_ln_alpha"])
    u, v = rng.standard_normal((2, len(np.atleast_1d(energy))))
    ln_t = p["mean_ln_t"] + p["sigma_ln_t"] * u
    ln_a = p["mean_ln_alpha"] + p["sigma_ln_alpha"] * (p["rho"] * u + np.sqrt(1.0 - p["rho"] ** 2) * v)
    return np.exp(ln_t), np.exp(ln_a)


def radial_parameters(energy: float, tau: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(R_C, R_T, p) in Moliere radii at depths ``tau`` = t / T of a shower of ``energy`` GeV."""
    ln_e = math.log(energy)
    z1, z2 = 0.0251 + 0.00319 * ln_e, 0.1162 - 0.000381 * Z_ATOMIC
    k1, k2, k3, k4 = 0.659 - 0.00309 * Z_ATOMIC, 0.645, -2.59, 0.3585 + 0.0421 * ln_e
    p1, p2, p3 = 0.2632 - 0.00094 * Z_ATOMIC, 0.401 + 0.00187 * Z_ATOMIC, 1.313 - 0.0686 * ln_e
    core = z1 + z2 * tau
    tail = k1 * (np.exp(k3 * (tau - k2)) + np.exp(k4 * (tau - k2)))
    w = (p2 - tau) / p3
    return core, tail, np.clip(p1 * np.exp(w - np.exp(w)), 0.0, 1.0)


def _radius(scale: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse CDF of 2 r R^2 / (r^2 + R^2)^2 (CDF r^2 / (r^2 + R^2)), capped at 10 R_M."""
    return np.minimum(scale * np.sqrt(u / (1.0 - u)), 10.0)


def shower_events(energy: np.ndarray, angle_deg: np.ndarray, seed: int | tuple, fluctuate: bool = True) -> np.ndarray:
    """Cell energies (n, 51, 51, 25) float32 in GeV of n showers with primary energies ``energy`` (GeV) and
    polar angles ``angle_deg``; a function of ``seed`` only. ``fluctuate=False`` keeps every event at the
    mean profile parameters and the mean deposited energy (the spots still scatter)."""
    rng = np.random.default_rng(seed)
    n = len(energy)
    nx, ny, nz = SHAPE
    big_t, alpha = draw_longitudinal(energy, rng, fluctuate)
    beta = (alpha - 1.0) / big_t
    spread = rng.standard_normal(n) * STOCHASTIC / np.sqrt(energy) if fluctuate else np.zeros(n)
    deposited = energy * SAMPLING_FRACTION * np.maximum(1.0 + spread, 0.0)
    cells = np.zeros((n, nx * ny * nz), np.float32)
    theta = np.radians(angle_deg)
    for i in range(n):
        spots = int(round(SPOTS_PER_GEV * energy[i]))
        t = rng.gamma(alpha[i], 1.0 / beta[i], spots)  # depth along the axis, X0
        core, tail, p = radial_parameters(float(energy[i]), t / big_t[i])
        scale = np.where(rng.random(spots) < p, core, tail)
        r = _radius(scale, rng.uniform(0.0, 0.999, spots)) * RM_OVER_X0  # X0
        phi = rng.uniform(0.0, 2.0 * np.pi, spots)
        a, b = r * np.cos(phi), r * np.sin(phi)  # transverse: a along x, b in the (y, z) plane
        s, c = math.sin(theta[i]), math.cos(theta[i])
        x = a / CELL_X0 + nx / 2
        y = ((t - AXIS_DEPTH_X0) * c + b * s) / CELL_X0 + ny / 2 + AXIS_DEPTH_X0 / math.tan(theta[i]) / CELL_X0
        z = (t * s - b * c) / LAYER_X0
        ix, iy, iz = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64), np.floor(z).astype(np.int64)
        inside = (ix >= 0) & (ix < nx) & (iy >= 0) & (iy < ny) & (iz >= 0) & (iz < nz)
        flat = (ix[inside] * ny + iy[inside]) * nz + iz[inside]
        cells[i] = np.bincount(flat, minlength=nx * ny * nz) * (deposited[i] / spots)
    return cells.reshape(n, nx, ny, nz)


def analytic_longitudinal(energy: float, angle_deg: float = 90.0, fluctuate: bool = False, draws: int = 4000) -> np.ndarray:
    """Expected fraction of the deposited energy in each of the 25 layers from the gamma profile alone
    (the transverse spread is not folded in: exact at 90 degrees). ``fluctuate`` averages over ``draws``
    (T, alpha) of the event-to-event distribution (a fixed sample)."""
    energies = np.full(draws if fluctuate else 1, float(energy))
    big_t, alpha = draw_longitudinal(energies, np.random.default_rng(0), fluctuate)
    beta = (alpha - 1.0) / big_t
    per_layer = 64  # Simpson's rule on 64 intervals of each layer (the density is smooth: error below 1e-7)
    t = np.linspace(0.0, SHAPE[2], SHAPE[2] * per_layer + 1) * LAYER_X0 / math.sin(math.radians(angle_deg))  # depth along the axis
    log_f = (np.log(beta)[:, None] + (alpha - 1.0)[:, None] * np.log(np.maximum(beta[:, None] * t[None, :], 1e-300))
             - beta[:, None] * t[None, :] - np.array([math.lgamma(a) for a in alpha])[:, None])
    f = np.exp(log_f).reshape(len(alpha), -1)  # (draws, points)
    h = t[1] - t[0]
    layers = []
    for k in range(SHAPE[2]):
        seg = f[:, k * per_layer: (k + 1) * per_layer + 1]
        layers.append(h / 3.0 * (seg[:, 0] + seg[:, -1] + 4.0 * seg[:, 1:-1:2].sum(axis=1) + 2.0 * seg[:, 2:-1:2].sum(axis=1)))
    return np.stack(layers, axis=1).mean(axis=0)
