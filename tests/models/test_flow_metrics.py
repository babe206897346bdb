"""Flow metrics checked on signals of known answer: relative L2, horizons, shedding frequency and Strouhal number, rollout scores."""

import numpy as np
import pytest

from models.karman.flow_metrics import RolloutScore, dominant_frequency, horizon, relative_l2, strouhal


def test_relative_l2_is_zero_for_equal_fields_and_scales_with_the_error():
    ref = np.ones((4, 4))
    assert relative_l2(ref, ref) == 0.0
    assert relative_l2(ref * 1.1, ref) == pytest.approx(0.1)


@pytest.mark.parametrize("frequency,samples", [(0.21, 64), (0.17, 40), (0.3, 25)])
def test_dominant_frequency_of_a_sampled_sine_with_drift(frequency, samples):
    dt = 0.5
    t = np.arange(samples) * dt
    signal = 0.3 * np.sin(2 * np.pi * frequency * t + 0.4) + 0.01 * t + 2.0
    assert dominant_frequency(signal, dt) == pytest.approx(frequency, rel=0.03)


def test_strouhal_is_the_frequency_in_convective_units():
    t = np.arange(80) * 0.25  # D/U
    assert strouhal(np.sin(2 * np.pi * 0.2 * t), 0.25) == pytest.approx(0.2, rel=0.02)


def test_no_frequency_for_a_constant_or_too_short_signal():
    assert np.isnan(dominant_frequency(np.full(32, 3.0), 1.0))
    assert np.isnan(dominant_frequency(np.array([1.0, 2.0]), 1.0))


def _wave(n: int, phase: float, amplitude: float = 1.0) -> np.ndarray:
    """A travelling wave state (3, 16, 64): u, v, p = A sin(kx - wt - phase) g(y), with t = n steps."""
    x = np.linspace(0, 2 * np.pi, 64, endpoint=False)
    y = np.sin(np.linspace(0, np.pi, 16))[:, None]
    field = amplitude * np.sin(2 * x[None, :] - OMEGA_DT * n - phase) * y
    return np.stack([field, np.roll(field, 3, axis=1), 0.5 * field])


OMEGA_DT = 2 * np.pi / 16  # 16 steps per shedding period
DT = 0.25  # time per step, D/U: the reference's St is 1 / (16 * 0.25) = 0.25


def _score(pred_of, steps: int) -> RolloutScore:
    """Score ``steps`` steps of predictions pred_of(n) against the travelling wave with no phase error."""
    score = RolloutScore(DT)
    fluid = np.ones((16, 64), bool)
    start = _wave(0, 0.0)
    for n in range(1, steps + 1):
        ref, pred = _wave(n, 0.0), pred_of(n)
        score.add(pred, ref, start, pred[0], ref[0], start[0], (8, 5), fluid)
    return score


def test_horizon_counts_leading_steps_and_stops_at_a_non_finite_error():
    assert horizon([0.05, 0.1, 0.2, 0.05], 0.1) == 2
    assert horizon([0.05, float("nan"), 0.0], 0.1) == 1
    assert horizon([0.01, 0.02], 0.1) == 2
    assert horizon([0.5], 0.1) == 0


def test_a_drifting_phase_keeps_the_wake_but_loses_correlation_at_the_known_step():
    """Prediction = reference shifted by a phase growing 0.05 rad per step (a frequency error):
    correlation cos(0.05 n), relative L2 2 |sin(0.025 n)|, Strouhal higher by 0.05 / (2 pi dt)."""
    drift = 0.05
    steps = 64
    score = _score(lambda n: _wave(n, drift * n), steps)
    corr = np.array(score.correlation)
    n = np.arange(1, steps + 1)
    np.testing.assert_allclose(corr, np.cos(drift * n), atol=1e-9)
    np.testing.assert_allclose(score.errors["vorticity"], 2 * np.abs(np.sin(drift * n / 2)), rtol=1e-9)
    summary = score.summary()
    expected_corr_steps = int(np.floor(np.arccos(0.8) / drift))  # last n with cos(drift n) >= 0.8
    assert summary["correlation_steps"] == expected_corr_steps
    assert summary["correlation_periods"] == pytest.approx(expected_corr_steps / 16, rel=0.02)
    assert summary["horizon_vorticity"] == int(np.floor(2 * np.arcsin(0.15) / drift))  # 2 sin(d n / 2) <= 0.3
    st_ref = 1 / (16 * DT)
    assert summary["strouhal_ref"] == pytest.approx(st_ref, rel=0.02)
    assert summary["strouhal_pred"] == pytest.approx(st_ref + drift / (2 * np.pi * DT), rel=0.02)
    assert summary["energy_ratio_max_deviation"] < 1e-9 and summary["stable_steps"] == steps  # the energy is right
    assert summary["shedding_amplitude_ratio"] == pytest.approx(1.0, rel=0.05)
    assert summary["finite"] == 1.0


def test_a_decaying_wake_keeps_its_phase_but_loses_energy_and_stops_shedding():
    """Prediction = reference damped by exp(-n / 20): correlation 1, u error 1 - exp(-n/20), energy ratio
    exp(-n/10); the shedding amplitude at the end is the damping's."""
    tau, steps = 20.0, 64
    score = _score(lambda n: _wave(n, 0.0, np.exp(-n / tau)), steps)
    n = np.arange(1, steps + 1)
    np.testing.assert_allclose(score.correlation, 1.0, atol=1e-12)
    np.testing.assert_allclose(score.errors["u"], 1 - np.exp(-n / tau), rtol=1e-9)
    np.testing.assert_allclose(score.energy_ratio, np.exp(-2 * n / tau), rtol=1e-9)
    summary = score.summary()
    assert summary["horizon_u"] == int(np.floor(tau * np.log(1 / 0.9)))  # 1 - exp(-n/tau) <= 0.1
    assert summary["stable_steps"] == int(np.floor(tau * np.log(1 / 0.9) / 2))  # exp(-2n/tau) >= 0.9
    assert summary["correlation_steps"] == steps
    assert summary["shedding_amplitude_ratio"] < np.exp(-(steps - 16) / tau) * 1.05
    assert summary["energy_ratio_final"] == pytest.approx(np.exp(-2 * steps / tau))


def test_skill_against_persistence_is_the_error_over_copying_the_start_frame():
    score = _score(lambda n: _wave(n, 0.1), 2)
    copy_error = 2 * abs(np.sin(OMEGA_DT / 2))  # the start frame against step 1: a shift of omega dt
    assert score.persistence["u"][0] == pytest.approx(copy_error, rel=1e-9)
    assert score.summary()["one_step_skill_u"] == pytest.approx(2 * np.sin(0.05) / copy_error, rel=1e-9)


def test_a_non_finite_rollout_is_reported_unstable():
    score = _score(lambda n: _wave(n, 0.0) * (np.nan if n >= 3 else 1.0), 5)
    summary = score.summary()
    assert summary["finite"] == 0.0 and summary["first_nonfinite_step"] == 3
    assert summary["horizon_u"] == 2 and np.isnan(summary["strouhal_pred"])


def test_a_record_shorter_than_two_periods_has_no_frequency():
    """Ten steps of a wake that sheds every 16: the periodogram's peak would be a number, not the
    frequency; so is the Strouhal number of a rollout that short."""
    dt = 0.25
    t = np.arange(10) * dt
    assert np.isnan(dominant_frequency(np.sin(2 * np.pi * 0.25 * t), dt))
    t = np.arange(36) * dt  # 2.25 periods
    assert dominant_frequency(np.sin(2 * np.pi * 0.25 * t), dt) == pytest.approx(0.25, rel=0.03)
    summary = _score(lambda n: _wave(n, 0.0), 10).summary()
    assert np.isnan(summary["strouhal_ref"]) and np.isnan(summary["strouhal_pred"])
    assert np.isnan(summary["correlation_periods"]) and summary["correlation_steps"] == 10
