import numpy as np
import pytest

from models.flow_metrics import dominant_frequency, relative_l2, strouhal


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
