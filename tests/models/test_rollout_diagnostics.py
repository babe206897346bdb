"""Rollout diagnostics checked on fields of known answer: phase-shifted and detuned waves, known spectra, a checkerboard, known decorrelation."""

import numpy as np
import pytest

from models.karman.flow_metrics import RolloutScore, correlation, relative_l2
from models.karman.rollout_diagnostics import (ACDM_INC_STD, LagWindow, acdm_mse, band_edges, band_errors, correlation_time, gaussian_lowpass,
                                        lag_aligned_error, lowpass_error, phase_frequency, phase_frequency_error, rollout_rmse)

OMEGA = 2 * np.pi / 15  # radians per step: 15 steps per shedding period, as the demo's wake at stride 1


def wave(t: float, shape: tuple[int, int] = (16, 48)) -> np.ndarray:
    """A travelling wave sin(k x - omega t) sin(pi y / H) (H, W) at time t in steps (synthetic)."""
    y, x = np.mgrid[: shape[0], : shape[1]]
    return np.sin(2 * np.pi * 3 * x / shape[1] - OMEGA * t) * np.sin(np.pi * (y + 0.5) / shape[0])


def window(n: int, half: int = 7) -> LagWindow:
    lags = np.arange(-half, half + 1)
    return LagWindow(np.stack([wave(n + s) for s in lags]), lags.astype(float))


@pytest.mark.parametrize("lead", [2.0, -3.0, 0.0])
def test_a_phase_shifted_wave_is_aligned_at_its_lag(lead):
    """Prediction = the reference ``lead`` steps ahead (phase phi = omega lead): the plain error is
    2 sin(phi / 2), the lag-aligned error 0 at the lag ``lead``."""
    n = 40
    pred, ref = wave(n + lead), wave(n)
    assert relative_l2(pred, ref) == pytest.approx(2 * abs(np.sin(OMEGA * lead / 2)), abs=1e-12)
    error, lag = lag_aligned_error(pred, window(n))
    assert lag == lead and error == pytest.approx(0.0, abs=1e-12)


def test_a_lag_between_stored_frames_leaves_the_error_of_the_nearest_one_and_masked_cells_do_not_count():
    pred = wave(40 + 2.3)
    mask = np.ones(pred.shape, bool)
    mask[:, :5] = False
    pred_masked = pred.copy()
    pred_masked[~mask] = 99.0
    error, lag = lag_aligned_error(pred_masked, window(40), mask)
    assert lag == 2.0 and error == pytest.approx(relative_l2(pred[mask], wave(42)[mask]))
    assert 0 < error < 2 * np.sin(OMEGA * 0.3 / 2) * 1.1  # the 0.3 steps the frames cannot tell apart
    assert lag_aligned_error(np.full(pred.shape, np.nan), window(40)) != lag_aligned_error(pred, window(40))


def probes(frequency: float, steps: int, amplitude: float = 1.0, phase: float = 0.0) -> np.ndarray:
    """v at three probes (steps, 3) oscillating at ``frequency`` cycles per step, each probe later in
    phase, with an offset and a slow drift (synthetic)."""
    n = np.arange(steps)[:, None]
    return amplitude * np.sin(2 * np.pi * frequency * n + phase + np.array([0.0, 1.1, 2.3])) + 0.2 + 1e-4 * n


@pytest.mark.parametrize("delta", [0.004, -0.01, 0.0])
def test_a_detuned_wave_gives_its_frequency_offset_and_phase_lag(delta):
    """Prediction at f (1 + delta), a phase 0.2 rad ahead, amplitude 0.7, against the reference at f =
    1/15 per step, over 600 steps (40 periods): the relative frequency error is delta and the phase
    lag at the last step 0.2 / 2 pi + delta f 599 periods."""
    f, steps, dt = 1 / 15, 600, 0.25
    out = phase_frequency_error(probes(f * (1 + delta), steps, 0.7, 0.2), probes(f, steps), dt)
    assert out["frequency_rel_error_phase"] == pytest.approx(delta, abs=2e-5)
    assert out["phase_lag_final"] == pytest.approx(0.2 / (2 * np.pi) + delta * f * (steps - 1), abs=2e-3)
    assert out["frequency_ref_phase"] == pytest.approx(f / dt, rel=1e-5)  # a Strouhal number where dt is in D/U
    short = phase_frequency_error(probes(f * (1 + delta), 60), probes(f, 60), dt)  # four periods
    assert short["frequency_rel_error_phase"] == pytest.approx(delta, abs=5e-4)


def test_no_phase_frequency_for_too_short_flat_or_non_finite_records():
    assert np.isnan(phase_frequency(probes(1 / 15, 20)[:, 0], 1.0))  # 1.3 periods
    assert np.isnan(phase_frequency(np.full(64, 2.0), 1.0))
    # the record's ends cost accuracy in short records: 2% at 3 periods, 1e-4 at 10
    assert phase_frequency(probes(1 / 15, 45)[:, 0], 1.0) == pytest.approx(1 / 15, rel=0.02)
    assert phase_frequency(probes(1 / 15, 150)[:, 0], 1.0) == pytest.approx(1 / 15, rel=1e-4)
    bad = probes(1 / 15, 600)
    bad[300] = np.nan
    assert np.isnan(phase_frequency_error(bad, probes(1 / 15, 600), 1.0)["frequency_rel_error_phase"])


SHAPE = (32, 64)


def modes(*amplitude_mode_phase) -> np.ndarray:
    """Sum of a sin(2 pi m x / W + phase) over (a, m, phase): a known spectrum (H, W) (synthetic)."""
    x = np.arange(SHAPE[1])[None, :] * np.ones(SHAPE)
    return sum(a * np.sin(2 * np.pi * m * x / SHAPE[1] + ph) for a, m, ph in amplitude_mode_phase)


REF = ((1.0, 1, 0.0), (0.5, 8, 0.4), (0.2, 24, 0.3))  # one mode in each of the low, mid and high bands


@pytest.mark.parametrize("band, mode", [(0, (0.01, 1, 0.0)), (1, (0.01, 8, 0.4)), (2, (0.01, 24, 1.3))])
def test_an_error_at_a_known_wavenumber_lands_in_its_band(band, mode):
    """Reference with one mode per band; the prediction adds 0.01 of one mode: that band's error is
    0.01 over the band's reference amplitude, the other bands' zero."""
    errors = band_errors(modes(*REF, mode), modes(*REF))
    expected = np.zeros(3)
    expected[band] = 0.01 / REF[band][0]
    np.testing.assert_allclose(errors, expected, atol=1e-12)


def test_band_edges_are_the_wells_three_log_spaced_bins_up_to_the_spectrums_corner():
    edges = band_edges(SHAPE)
    assert edges[0] == 0 and edges[-1] == pytest.approx(np.pi * np.sqrt(2))
    ratio = edges[-1] / (2 * np.pi / 64)
    np.testing.assert_allclose(edges[1:] / (2 * np.pi / 64), ratio ** (np.arange(1, 4) / 3))
    assert np.isnan(band_errors(np.zeros(SHAPE), np.zeros(SHAPE))).all()  # no reference energy: no relative error


def test_the_lowpass_removes_a_cell_scale_checkerboard_and_keeps_a_smooth_error():
    ref = wave(0.0, (40, 60)) + 0.3 * wave(4.0, (40, 60)).T[:40, :40].mean()
    y, x = np.mgrid[:40, :60]
    checkerboard = (-1.0) ** (x + y)
    speckled = ref + 0.3 * checkerboard
    assert relative_l2(speckled, ref) == pytest.approx(0.3 * np.linalg.norm(checkerboard) / np.linalg.norm(ref))
    assert lowpass_error(speckled, ref) < 1e-8
    assert lowpass_error(1.1 * ref, ref) == pytest.approx(0.1)  # linear: a smooth error stays
    smoothed = gaussian_lowpass(np.ones((8, 9)))
    np.testing.assert_allclose(smoothed, 1.0)  # the weights sum to one, also at the borders


def test_correlation_time_counts_the_steps_until_a_known_decorrelation():
    """Prediction = reference up to step 37, then an unrelated field: 37 steps at or above 0.8."""
    rng = np.random.default_rng(0)
    corr = [correlation(wave(n) if n <= 37 else rng.standard_normal((16, 48)), wave(n)) for n in range(1, 61)]
    assert correlation_time(corr, 0.8) == 37
    assert correlation_time([0.9, float("nan"), 0.95], 0.8) == 1
    assert correlation_time(np.cos(0.05 * np.arange(1, 100)), 0.8) == int(np.arccos(0.8) / 0.05)


def test_rollout_rmse_averages_the_squared_error_up_to_the_horizon():
    a = 0.01
    step_mse = (a * np.arange(1, 601)) ** 2  # an error growing linearly: a n at step n
    for h in (1, 50, 600):
        assert rollout_rmse(step_mse, h) == pytest.approx(a * np.sqrt((h + 1) * (2 * h + 1) / 6))
    assert np.isnan(rollout_rmse(step_mse[:10], 50))


def test_acdm_mse_normalises_each_field_by_its_deviation_and_ignores_the_obstacle():
    rng = np.random.default_rng(1)
    steps = 60
    ref = rng.standard_normal((steps, 3, 16, 32)) * np.array([0.3, 0.15, 0.01])[None, :, None, None]
    solid = np.zeros((16, 32), bool)
    solid[6:10, 4:8] = True
    ref[..., solid] = 0.0
    eps = np.array([0.02, 0.01, 0.001])
    pred = ref + eps[None, :, None, None]
    pred[..., solid] = 5.0  # the obstacle's cells do not count
    std = ref.std(axis=(0, 2, 3))
    scale = np.array([(2 * std[0] + std[1]) / 3] * 2 + [std[2]])
    fluid_share = 1 - solid.mean()
    expected = fluid_share * eps ** 2 / scale ** 2
    out = acdm_mse(pred, ref, solid)
    assert out["acdm_mse"] == pytest.approx(expected.mean())
    acdm_var = np.array([ACDM_INC_STD["velocity"]] * 2 + [ACDM_INC_STD["pressure"]]) ** 2
    assert out["acdm_mse_inc_units"] == pytest.approx((expected * acdm_var).mean())
    assert acdm_mse(ref, ref, solid)["acdm_mse"] == 0.0


def test_a_rollout_score_summarises_the_diagnostics_of_a_detuned_wake():
    """A wake whose prediction sheds 0.4% fast: the phase says +0.4%, the lag grows to about
    0.004 x 150 steps = 0.6 steps, the lag-aligned error stays below the plain one, the low-passed and
    per-band errors are measured, and the anchors' metrics cover the horizons the rollout reaches."""
    steps, delta = 150, 0.004
    shape = (16, 48)
    fluid = np.ones(shape, bool)
    score = RolloutScore(0.25)

    def state(t):
        w = wave(t, shape)
        return np.stack([1.0 + 0.1 * w, w, 0.01 * w])

    start = state(0)
    for n in range(1, steps + 1):
        pred, ref = state(n * (1 + delta)), state(n)
        score.add(pred, ref, start, pred[1], ref[1], start[1], (8, 5), fluid, window(n), [(8, 5), (8, 20), (4, 30)],
                  (slice(0, 16), slice(16, 48)))
    s = score.summary()
    assert s["frequency_rel_error_phase"] == pytest.approx(delta, abs=2e-4)
    assert s["strouhal_ref_phase"] == pytest.approx(1 / (15 * 0.25), rel=1e-4)
    assert s["final_lag_steps"] == round(steps * delta)
    assert s["horizon_vorticity_lagged"] == steps and s["mean_rel_l2_vorticity_lagged"] < s["mean_rel_l2_vorticity"]
    assert s["final_rel_l2_vorticity_lowpass"] == pytest.approx(s["final_rel_l2_vorticity"], rel=0.05)  # a smooth wave: the same
    assert np.isfinite([s["band_error_low_final"], s["band_error_mid_mean"]]).all()
    assert s["correlation_time"] == s["correlation_steps"] * 0.25
    assert 0 < s["acdm_mse_60_inc_units"] < s["acdm_mse_60"]  # ACDM's deviations are below one
    assert np.isfinite(s["acdm_mse_60"]) and np.isfinite(s["mgn_rmse_50"]) and np.isnan(s["mgn_rmse_600"])
    v_error = np.sqrt(np.mean((state(1 + delta)[:2] - state(1)[:2]) ** 2))
    assert s["mgn_rmse_1"] == pytest.approx(v_error)
