"""Scores of a predicted flow against a reference: relative L2 error, wake frequency (Strouhal)."""

import numpy as np


def relative_l2(pred: np.ndarray, ref: np.ndarray) -> float:
    """||pred - ref|| / ||ref|| (over all elements)."""
    return float(np.linalg.norm(pred - ref) / max(np.linalg.norm(ref), 1e-12))


def dominant_frequency(signal: np.ndarray, dt: float, oversample: int = 16) -> float:
    """Frequency (1/time unit) of the strongest oscillation in a uniformly sampled signal: the peak of
    the Hann-windowed, zero-padded periodogram of the signal minus its linear trend, refined by a
    parabola through the peak and its neighbours. NaN for a constant signal or fewer than 4 samples."""
    x = np.asarray(signal, dtype=np.float64)
    if x.size < 4 or dt <= 0:
        return float("nan")
    t = np.arange(x.size)
    x = x - np.polyval(np.polyfit(t, x, 1), t)
    if not np.any(np.abs(x) > 1e-12 * max(1.0, float(np.abs(signal).max()))):
        return float("nan")
    n = oversample * x.size
    power = np.abs(np.fft.rfft(x * np.hanning(x.size), n)) ** 2
    k = int(np.argmax(power[1:])) + 1  # skip the mean
    shift = 0.0
    if 0 < k < len(power) - 1:
        a, b, c = np.log(power[k - 1 : k + 2] + 1e-300)
        denom = a - 2 * b + c
        shift = 0.5 * (a - c) / denom if denom < 0 else 0.0
    return (k + shift) / (n * dt)


def strouhal(probe: np.ndarray, dt_convective: float) -> float:
    """St = f D / U of a probe signal sampled every ``dt_convective`` (time in units of D/U)."""
    return dominant_frequency(probe, dt_convective)
