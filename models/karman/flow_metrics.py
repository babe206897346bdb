"""Scores of a predicted flow against a reference: errors, horizons, wake frequency, skill, correlation, energy.

Relative L2 error, wake frequency (Strouhal), useful horizon, skill against persistence, vorticity
correlation, kinetic energy, shedding; and, from models.karman.rollout_diagnostics, the phase and shape
diagnostics and the anchors' metrics of a rollout.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from models.karman.rollout_diagnostics import (ACDM_STEPS, BANDS, MGN_HORIZONS, MIN_CYCLES, LagWindow, acdm_mse, band_errors, correlation_time,
                                        lag_aligned_error, lowpass_error, phase_frequency_error, rollout_rmse)


def relative_l2(pred: np.ndarray, ref: np.ndarray) -> float:
    """||pred - ref|| / ||ref|| (over all elements)."""
    return float(np.linalg.norm(pred - ref) / max(np.linalg.norm(ref), 1e-12))


def dominant_frequency(signal: np.ndarray, dt: float, oversample: int = 16, min_cycles: float = MIN_CYCLES) -> float:
    """Frequency (1/time unit) of the strongest oscillation in a uniformly sampled signal: the peak of
    the Hann-windowed, zero-padded periodogram of the signal minus its linear trend, refined by a
    parabola through the peak and its neighbours. NaN for a constant signal, fewer than 4 samples, or a
    peak with fewer than ``min_cycles`` cycles in the record."""
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
    frequency = (k + shift) / (n * dt)
    return frequency if frequency * x.size * dt >= min_cycles else float("nan")


def strouhal(probe: np.ndarray, dt_convective: float) -> float:
    """St = f D / U of a probe signal sampled every ``dt_convective`` (time in units of D/U)."""
    return dominant_frequency(probe, dt_convective)


def horizon(errors, threshold: float) -> int:
    """Leading steps whose error stays at or below ``threshold`` (a non-finite error ends the run)."""
    for i, e in enumerate(errors):
        if not (e <= threshold):  # NaN fails too
            return i
    return len(errors)


def correlation(pred: np.ndarray, ref: np.ndarray) -> float:
    """Pearson correlation of two fields over all elements; NaN if either is constant or non-finite."""
    a = np.asarray(pred, np.float64).ravel()
    b = np.asarray(ref, np.float64).ravel()
    a, b = a - a.mean(), b - b.mean()
    denom = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / denom) if denom > 0 and np.isfinite(denom) else float("nan")


def kinetic_energy(u: np.ndarray, v: np.ndarray) -> float:
    """Mean kinetic energy per unit mass, 0.5 (u² + v²), over the given cells."""
    return float(0.5 * np.mean(np.square(u, dtype=np.float64) + np.square(v, dtype=np.float64)))


def oscillation_amplitude(signal: np.ndarray) -> float:
    """Half the peak-to-peak range of a signal (0 for a settled, non-shedding wake); over at least one
    period it does not depend on where the window starts."""
    x = np.asarray(signal, np.float64)
    if x.size < 2 or not np.all(np.isfinite(x)):
        return float("nan")
    return float(0.5 * (x.max() - x.min()))


@dataclass
class RolloutScore:
    """Per-step scores of an autoregressive rollout against its reference, and their summary.

    Each step takes the predicted and reference states (3, H, W: u, v, p), the start frame (for the
    persistence baseline: copying the frame the rollout started from), the vorticity of prediction and
    reference, and the probe values of v two obstacle sizes downstream (for the wake frequency); and,
    where given, the reference's vorticity at shifts around the step (for the lag-aligned error), the
    wake probes (for the frequency from the phase) and the wake region (for the band errors).
    ``dt``: time between steps in convective units D/U; the velocity RMSE is in the fields' velocity
    unit (the stored frames' is the mean inflow)."""

    dt: float
    threshold_u: float = 0.1
    threshold_vorticity: float = 0.3
    threshold_correlation: float = 0.8
    lowpass_sigma: float = 1.5
    errors: dict = field(default_factory=lambda: {k: [] for k in ("u", "v", "p", "vorticity")})
    persistence: dict = field(default_factory=lambda: {k: [] for k in ("u", "v", "p", "vorticity")})
    correlation: list = field(default_factory=list)
    energy_ratio: list = field(default_factory=list)
    probe_pred: list = field(default_factory=list)
    probe_ref: list = field(default_factory=list)
    first_nonfinite: int | None = None
    lagged: list = field(default_factory=list)  # lag-aligned vorticity error per step
    lags: list = field(default_factory=list)  # the shift (steps) that gives it
    lowpass: list = field(default_factory=list)  # vorticity error after the low-pass
    bands: list = field(default_factory=list)  # (3,) vorticity error per wavenumber band on the wake region
    wake_pred: list = field(default_factory=list)  # v at the wake probes
    wake_ref: list = field(default_factory=list)
    velocity_mse: list = field(default_factory=list)  # mean squared velocity error over the fluid
    acdm_pred: list = field(default_factory=list)  # the first ACDM_STEPS states (3, H, W), float32
    acdm_ref: list = field(default_factory=list)
    solid: np.ndarray | None = None

    def add(self, pred: np.ndarray, ref: np.ndarray, start: np.ndarray, w_pred: np.ndarray, w_ref: np.ndarray,
            w_start: np.ndarray, probe: tuple[int, int], fluid: np.ndarray, window: LagWindow | None = None,
            probes: Sequence[tuple[int, int]] = (), wake: tuple[slice, slice] | None = None) -> dict[str, float]:
        """Score one step; returns its per-step values (relative L2 per field, correlation, energy ratio,
        and the lag-aligned, low-passed and per-band vorticity errors, NaN where not measured)."""
        step = len(self.correlation) + 1
        if self.first_nonfinite is None and not np.all(np.isfinite(pred)):
            self.first_nonfinite = step
        values = {}
        for c, name in enumerate(("u", "v", "p")):
            values[name] = relative_l2(pred[c], ref[c])
            self.persistence[name].append(relative_l2(start[c], ref[c]))
        values["vorticity"] = relative_l2(w_pred, w_ref)
        self.persistence["vorticity"].append(relative_l2(w_start, w_ref))
        for k in self.errors:
            self.errors[k].append(values[k])
        self.correlation.append(correlation(w_pred[fluid], w_ref[fluid]))
        e_ref = kinetic_energy(ref[0][fluid], ref[1][fluid])
        self.energy_ratio.append(kinetic_energy(pred[0][fluid], pred[1][fluid]) / e_ref if e_ref > 0 else float("nan"))
        self.probe_pred.append(float(pred[1][probe]))
        self.probe_ref.append(float(ref[1][probe]))
        self._diagnose(pred, ref, w_pred, w_ref, fluid, window, probes, wake)
        return {f"rel_l2_{k}": v for k, v in values.items()} | {
            "vorticity_correlation": self.correlation[-1], "energy_ratio": self.energy_ratio[-1],
            "rel_l2_vorticity_lagged": self.lagged[-1], "lag_steps": self.lags[-1], "rel_l2_vorticity_lowpass": self.lowpass[-1],
            **{f"band_error_{b}": float(e) for b, e in zip(BANDS, self.bands[-1])}}

    def _diagnose(self, pred, ref, w_pred, w_ref, fluid, window, probes, wake) -> None:
        """The step's phase and shape diagnostics and what the anchors' metrics need."""
        nan = float("nan")
        finite = bool(np.all(np.isfinite(w_pred)))
        lagged, lag = lag_aligned_error(w_pred, window, fluid) if window is not None else (nan, nan)
        self.lagged.append(lagged)
        self.lags.append(lag)
        self.lowpass.append(lowpass_error(w_pred, w_ref, self.lowpass_sigma, fluid) if finite else nan)
        self.bands.append(band_errors(w_pred[wake], w_ref[wake]) if wake is not None and finite else np.full(len(BANDS), nan))
        self.wake_pred.append([float(pred[1][q]) for q in probes])
        self.wake_ref.append([float(ref[1][q]) for q in probes])
        du = pred[:2, fluid] - ref[:2, fluid]  # (2, fluid cells)
        self.velocity_mse.append(float(np.mean(np.square(du, dtype=np.float64))))
        if len(self.acdm_pred) < ACDM_STEPS:
            self.acdm_pred.append(pred.astype(np.float32))
            self.acdm_ref.append(ref.astype(np.float32))
            self.solid = ~fluid

    def skill(self, field_name: str, step: int = 1) -> float:
        """Error of the prediction over the error of persistence (copying the start frame) at a step."""
        e, p = self.errors[field_name][step - 1], self.persistence[field_name][step - 1]
        return e / p if p > 0 else float("nan")

    def summary(self) -> dict[str, float]:
        steps = len(self.correlation)
        if steps == 0:
            return {}
        pred, ref = np.array(self.probe_pred), np.array(self.probe_ref)
        finite = self.first_nonfinite is None
        st_pred = strouhal(pred, self.dt) if finite else float("nan")
        st_ref = strouhal(ref, self.dt)
        period_steps = 1.0 / (st_ref * self.dt) if st_ref == st_ref and st_ref > 0 else float("nan")
        corr_steps = correlation_time(self.correlation, self.threshold_correlation)
        ratio = np.array(self.energy_ratio)
        stable = horizon(np.abs(ratio - 1.0), 0.1)
        # The wake still sheds if the probe oscillates in the last period about as much as the reference's.
        tail = max(3, int(np.ceil(period_steps)) + 1 if period_steps == period_steps else steps // 4)
        amp_ref = oscillation_amplitude(ref[-tail:])
        amp_ratio = oscillation_amplitude(pred[-tail:]) / amp_ref if amp_ref > 0 else float("nan")
        return {
            "one_step_rel_l2_u": self.errors["u"][0], "one_step_rel_l2_v": self.errors["v"][0],
            "one_step_rel_l2_p": self.errors["p"][0], "one_step_rel_l2_vorticity": self.errors["vorticity"][0],
            "one_step_skill_u": self.skill("u"), "one_step_skill_vorticity": self.skill("vorticity"),
            "horizon_u": horizon(self.errors["u"], self.threshold_u),
            "horizon_vorticity": horizon(self.errors["vorticity"], self.threshold_vorticity),
            "final_rel_l2_u": self.errors["u"][-1], "final_rel_l2_vorticity": self.errors["vorticity"][-1],
            "mean_rel_l2_u": float(np.mean(self.errors["u"])), "mean_rel_l2_vorticity": float(np.mean(self.errors["vorticity"])),
            "strouhal_pred": st_pred, "strouhal_ref": st_ref,
            "strouhal_rel_error": abs(st_pred - st_ref) / st_ref if st_ref == st_ref and st_ref > 0 else float("nan"),
            "rollout_periods": steps / period_steps if period_steps == period_steps else float("nan"),
            "correlation_steps": corr_steps,
            "correlation_periods": corr_steps / period_steps if period_steps == period_steps else float("nan"),
            "final_vorticity_correlation": self.correlation[-1],
            "energy_ratio_final": float(ratio[-1]), "energy_ratio_max_deviation": float(np.nanmax(np.abs(ratio - 1.0))) if finite else float("inf"),
            "stable_steps": stable, "finite": float(finite), "first_nonfinite_step": float(self.first_nonfinite or 0),
            "shedding_amplitude_ratio": amp_ratio,
            "correlation_time": corr_steps * self.dt,
        } | self.diagnostics()

    def diagnostics(self) -> dict[str, float]:
        """Summary of the phase and shape diagnostics and the anchors' metrics (models.karman.rollout_diagnostics):
        the frequency from the wake probes' phase (signed relative error, the final phase lag in periods,
        the reference's Strouhal number), horizons, final and mean values of the lag-aligned and
        low-passed vorticity errors and the final lag, the band errors (final and mean), ACDM's MSE over
        its 60 steps and MeshGraphNets' velocity RMSE at 1, 50 and 600 steps (NaN where the rollout is
        shorter or the diagnostic was not measured)."""
        nan = float("nan")
        steps = len(self.correlation)
        out = {}
        finite = self.first_nonfinite is None
        if self.wake_ref and len(self.wake_ref[0]):
            phase = phase_frequency_error(np.array(self.wake_pred), np.array(self.wake_ref), self.dt)
            out |= {"frequency_rel_error_phase": phase["frequency_rel_error_phase"], "phase_lag_final": phase["phase_lag_final"],
                    "strouhal_ref_phase": phase["frequency_ref_phase"]}
        else:
            out |= {"frequency_rel_error_phase": nan, "phase_lag_final": nan, "strouhal_ref_phase": nan}
        for name, values in (("lagged", self.lagged), ("lowpass", self.lowpass)):
            measured = not all(v != v for v in values)
            out |= {f"horizon_vorticity_{name}": horizon(values, self.threshold_vorticity) if measured else nan,
                    f"final_rel_l2_vorticity_{name}": values[-1], f"mean_rel_l2_vorticity_{name}": float(np.mean(values))}
        out["final_lag_steps"] = self.lags[-1]
        bands = np.array(self.bands)  # (steps, 3)
        for j, b in enumerate(BANDS):
            out |= {f"band_error_{b}_final": float(bands[-1, j]), f"band_error_{b}_mean": float(np.mean(bands[:, j]))}
        acdm = acdm_mse(np.stack(self.acdm_pred), np.stack(self.acdm_ref), self.solid) if steps >= ACDM_STEPS and finite else {}
        out |= {f"acdm_mse_{ACDM_STEPS}": acdm.get("acdm_mse", nan), f"acdm_mse_{ACDM_STEPS}_inc_units": acdm.get("acdm_mse_inc_units", nan)}
        out |= {f"mgn_rmse_{h}": rollout_rmse(self.velocity_mse, h) for h in MGN_HORIZONS}
        return out
