"""Rollout diagnostics that separate phase from shape, and the error measures the published surrogates of this flow report.

Phase: the shedding frequency from the unwrapped phase of probe signals, and the vorticity error after
the best time shift against the reference. Shape: the error after a Gaussian low-pass, and the error
per wavenumber band on a windowed wake region (The Well's binned spectral error). The anchors' numbers:
ACDM's MSE over 60 steps (Kohl et al. 2023), MeshGraphNets' rollout RMSE of velocity (Pfaff et al.
2021) and PDE-Refiner's high-correlation time (Lippe et al. 2023). NumPy only.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Cycles a record must hold for its frequency to count: a record shorter than about two periods cannot
# tell the frequency (the periodogram's resolution is one cycle per record), and its peak says nothing.
MIN_CYCLES = 2.0

# Share of a probe record dropped at each end before the phase is fitted: the analytic signal of a
# finite record is off near its ends (the record is not periodic).
PHASE_TRIM = 0.1

# ACDM normalises each field by its standard deviation over the training set (velocity components share
# one) and reports the MSE after undoing it, in the units of its incompressible cylinder-wake data
# (Inc, PhiFlow); these are those standard deviations (velocity, pressure).
ACDM_INC_STD = {"velocity": 0.206128, "pressure": 0.003942}
ACDM_STEPS = 60
MGN_HORIZONS = (1, 50, 600)
BANDS = ("low", "mid", "high")


def _detrended(signal: np.ndarray) -> np.ndarray:
    x = np.asarray(signal, np.float64)
    t = np.arange(x.size)
    return x - np.polyval(np.polyfit(t, x, 1), t)


def analytic_signal(signal: np.ndarray) -> np.ndarray:
    """The analytic signal x + i H[x] of a real signal (its linear trend removed), by the FFT: negative
    frequencies zeroed, positive ones doubled."""
    x = _detrended(signal)
    n = x.size
    gain = np.zeros(n)
    gain[0] = 1.0
    gain[1 : (n + 1) // 2] = 2.0
    if n % 2 == 0:
        gain[n // 2] = 1.0
    return np.fft.ifft(np.fft.fft(x) * gain)


def _trimmed(n: int, trim: float) -> slice:
    cut = max(1, int(round(trim * n)))
    return slice(cut, n - cut)


def _slope(y: np.ndarray, part: slice) -> tuple[float, float]:
    """Least-squares slope and intercept of y over the samples ``part``."""
    t = np.arange(y.size)[part]
    slope, intercept = np.polyfit(t, y[part], 1)
    return float(slope), float(intercept)


def phase_frequency(signal: np.ndarray, dt: float, trim: float = PHASE_TRIM, min_cycles: float = MIN_CYCLES) -> float:
    """Frequency (1/time unit) of a narrow-band oscillation from the slope of its unwrapped analytic
    phase, fitted after dropping ``trim`` of the record at each end. NaN for a non-finite or flat
    signal, fewer than 8 samples, or fewer than ``min_cycles`` cycles in the record."""
    x = np.asarray(signal, np.float64)
    if x.size < 8 or dt <= 0 or not np.all(np.isfinite(x)) or np.ptp(_detrended(x)) <= 1e-12 * max(1.0, float(np.abs(x).max())):
        return float("nan")
    phase = np.unwrap(np.angle(analytic_signal(x)))
    slope, _ = _slope(phase, _trimmed(x.size, trim))
    frequency = slope / (2 * np.pi * dt)
    return frequency if frequency * x.size * dt >= min_cycles else float("nan")


def phase_frequency_error(pred: np.ndarray, ref: np.ndarray, dt: float, trim: float = PHASE_TRIM) -> dict[str, float]:
    """The prediction's shedding frequency against the reference's, from probe signals (steps, probes):
    ``frequency_rel_error_phase`` = (f_pred - f_ref) / f_ref, signed (positive: the prediction sheds
    too fast), with f_pred - f_ref the slope of the unwrapped phase difference of the two analytic
    signals and f_ref the slope of the reference's phase, each the mean over the probes;
    ``phase_lag_final`` = the fitted phase difference at the last step in periods (positive: the
    prediction is ahead); ``frequency_ref_phase`` = f_ref. NaN where the reference has no frequency
    (too short or flat) or the prediction is not finite."""
    pred, ref = np.atleast_2d(np.asarray(pred, np.float64).T).T, np.atleast_2d(np.asarray(ref, np.float64).T).T  # (steps, probes)
    nan = {"frequency_rel_error_phase": float("nan"), "phase_lag_final": float("nan"), "frequency_ref_phase": float("nan")}
    f_refs = [phase_frequency(ref[:, j], dt, trim) for j in range(ref.shape[1])]
    if not f_refs or any(f != f for f in f_refs) or not np.all(np.isfinite(pred)):
        return nan
    part = _trimmed(pred.shape[0], trim)
    offsets, lags = [], []
    for j in range(ref.shape[1]):
        delta = np.unwrap(np.angle(analytic_signal(pred[:, j]) * np.conj(analytic_signal(ref[:, j]))))
        slope, intercept = _slope(delta, part)
        offsets.append(slope / (2 * np.pi * dt))
        lags.append((slope * (pred.shape[0] - 1) + intercept) / (2 * np.pi))
    f_ref = float(np.mean(f_refs))
    return {"frequency_rel_error_phase": float(np.mean(offsets)) / f_ref, "phase_lag_final": float(np.mean(lags)), "frequency_ref_phase": f_ref}


@dataclass(frozen=True)
class LagWindow:
    """Reference frames (K, H, W) around a rollout step and their time shifts (K,) in rollout steps
    (negative: earlier than the step's own reference; a shift s is the stored frame n·stride + s·stride)."""

    frames: np.ndarray
    lags: np.ndarray


def lag_aligned_error(pred: np.ndarray, window: LagWindow, mask: np.ndarray | None = None) -> tuple[float, float]:
    """(error, lag): the smallest relative L2 error ||pred - ref_s|| / ||ref_s|| over the window's
    reference frames ref_s, and the shift s that gives it; over the cells of ``mask`` if given."""
    frames = np.asarray(window.frames, np.float64)  # (K, H, W)
    weight = np.ones(frames.shape[1:]) if mask is None else np.asarray(mask, np.float64)
    diff = frames - np.where(weight > 0, np.asarray(pred, np.float64), 0.0)[None]
    err2 = np.einsum("khw,khw,hw->k", diff, diff, weight)
    ref2 = np.einsum("khw,khw,hw->k", frames, frames, weight)
    errors = np.sqrt(err2) / np.maximum(np.sqrt(ref2), 1e-12)
    if not np.all(np.isfinite(errors)):
        return float("nan"), float("nan")
    best = int(np.argmin(errors))
    return float(errors[best]), float(window.lags[best])


def gaussian_kernel(sigma: float) -> np.ndarray:
    """Normalised 1-D Gaussian weights of standard deviation ``sigma`` cells, out to 4 sigma."""
    radius = max(1, int(4 * sigma + 0.5))
    x = np.arange(-radius, radius + 1)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def _smooth_rows(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """x (..., W) convolved along its last axis with an odd symmetric kernel, mirrored at the ends."""
    r = len(kernel) // 2
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(r, r)], mode="reflect")
    n = x.shape[-1]
    out = kernel[0] * padded[..., :n]
    for i in range(1, len(kernel)):
        out += kernel[i] * padded[..., i : i + n]
    return out


def gaussian_lowpass(field: np.ndarray, sigma: float = 1.5) -> np.ndarray:
    """Field (..., H, W) smoothed by a separable Gaussian of ``sigma`` cells; mirrored at the borders
    without repeating the edge cell, so that a checkerboard stays one up to the border."""
    k = gaussian_kernel(sigma)
    rows = _smooth_rows(np.asarray(field, np.float64), k)
    return _smooth_rows(rows.swapaxes(-1, -2), k).swapaxes(-1, -2)


def lowpass_error(pred: np.ndarray, ref: np.ndarray, sigma: float = 1.5, mask: np.ndarray | None = None) -> float:
    """Relative L2 error of the two fields (H, W) after each is smoothed by gaussian_lowpass(sigma):
    the error a cell-scale speckle does not reach; over the cells of ``mask`` if given."""
    p, r = gaussian_lowpass(pred, sigma), gaussian_lowpass(ref, sigma)
    if mask is not None:
        p, r = p[mask], r[mask]
    return float(np.linalg.norm(p - r) / max(np.linalg.norm(r), 1e-12))


def hann_window(shape: tuple[int, int]) -> np.ndarray:
    """2-D periodic Hann window (H, W): zero at the first row and column, one in the middle."""
    rows, cols = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n) for n in shape)
    return rows[:, None] * cols[None, :]


def band_edges(shape: tuple[int, int]) -> np.ndarray:
    """The Well's default bins of the radial wavenumber |k| (radians per cell): edges 0 and three more
    log-spaced from 2 pi / max(H, W) to pi sqrt(2) (the corner of the spectrum), giving low, mid and
    high bands."""
    edges = np.logspace(np.log10(2 * np.pi / max(shape)), np.log10(np.pi * np.sqrt(2) + 1e-6), 4)
    edges[0] = 0.0
    return edges


def band_errors(pred: np.ndarray, ref: np.ndarray, edges: np.ndarray | None = None, window: bool = True) -> np.ndarray:
    """Relative L2 error per radial-wavenumber band (len(edges) - 1,): sqrt of the error's spectral
    energy in the band over the reference's (the square root of The Well's normalised binned spectral
    MSE), both fields (H, W) multiplied by a Hann window first (``window``), since a wake region is
    not periodic. NaN for a band where the reference has no energy."""
    p, r = np.asarray(pred, np.float64), np.asarray(ref, np.float64)
    if window:
        w = hann_window(r.shape)
        p, r = p * w, r * w
    edges = band_edges(r.shape) if edges is None else np.asarray(edges, np.float64)
    ky, kx = (2 * np.pi * np.fft.fftfreq(n) for n in r.shape)
    k = np.sqrt(ky[:, None] ** 2 + kx[None, :] ** 2).ravel()
    band = np.searchsorted(edges, k, side="right") - 1  # k in [edges[b], edges[b + 1])
    err = np.abs(np.fft.fft2(p - r)).ravel() ** 2
    energy = np.abs(np.fft.fft2(r)).ravel() ** 2
    nb = len(edges) - 1
    e_err = np.bincount(band[band < nb], err[band < nb], nb)
    e_ref = np.bincount(band[band < nb], energy[band < nb], nb)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(e_ref > 0, np.sqrt(e_err / np.where(e_ref > 0, e_ref, 1.0)), np.nan)


def correlation_time(correlations: Sequence[float], threshold: float = 0.8) -> int:
    """Leading steps whose correlation with the reference stays at or above ``threshold`` (PDE-Refiner's
    high-correlation time, in steps); a NaN correlation ends it."""
    for i, c in enumerate(correlations):
        if not (c >= threshold):
            return i
    return len(correlations)


def rollout_rmse(step_mse: Sequence[float], horizon: int) -> float:
    """MeshGraphNets' rollout RMSE at ``horizon``: the square root of the squared error averaged over
    steps 1 .. horizon (and over the cells and components each step's mean already covers); NaN if the
    rollout is shorter."""
    mse = np.asarray(step_mse, np.float64)
    return float(np.sqrt(mse[:horizon].mean())) if 0 < horizon <= mse.size else float("nan")


def acdm_mse(pred: np.ndarray, ref: np.ndarray, solid: np.ndarray | None = None) -> dict[str, float]:
    """ACDM's error of a rollout (T, 3, H, W) of u, v, p against its reference: the squared error of
    each field, with the obstacle's cells set to zero in both, averaged over steps, all cells and the
    three fields. ``acdm_mse`` normalises each field as ACDM's data pipeline does, by its standard
    deviation, the velocity components sharing one (two parts the streamwise component's, one part
    the cross-stream one's); here the deviations are the reference's own over these steps, where ACDM
    takes its training set's. ``acdm_mse_inc_units`` is that normalised error put back into the units
    of ACDM's Inc data with ACDM's Inc deviations (their published MSEs are in those units). NaN for an
    empty or non-finite rollout."""
    p = np.array(pred, np.float64)  # (T, 3, H, W)
    r = np.array(ref, np.float64)
    if p.size == 0 or not np.all(np.isfinite(p)):
        return {"acdm_mse": float("nan"), "acdm_mse_inc_units": float("nan")}
    if solid is not None:
        p[..., np.asarray(solid, bool)] = 0.0
        r[..., np.asarray(solid, bool)] = 0.0
    mse = np.mean((p - r) ** 2, axis=(0, 2, 3))  # (3,) per field
    std = r.std(axis=(0, 2, 3))
    std_velocity = (2 * std[0] + std[1]) / 3
    normalised = mse / np.maximum(np.array([std_velocity, std_velocity, std[2]]) ** 2, 1e-30)
    acdm_var = np.array([ACDM_INC_STD["velocity"], ACDM_INC_STD["velocity"], ACDM_INC_STD["pressure"]]) ** 2
    return {"acdm_mse": float(normalised.mean()), "acdm_mse_inc_units": float((normalised * acdm_var).mean())}
