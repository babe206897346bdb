"""The Kármán rollout loop's diagnostics on a synthetic travelling-wave wake: an oracle one frame ahead is found one step ahead, in phase and frequency."""

import numpy as np
import pytest

from models.karman.flow_metrics import RolloutScore
from tasks.workloads.karman.data import Normalizer, StepCodec
from tasks.workloads.karman.scoring import reference_period, roll, wake_box, wake_probes
from tasks.workloads.karman.simulation import SimulationSpec

PERIOD = 15  # stored frames per shedding period
SIM = SimulationSpec(nx=64, ny=32, reynolds=100.0, u_max=0.1, size=6.0, cx=12.0, cy=16.0, warmup_steps=0, frames=80, frame_every=10)


def synthetic_frames(count: int) -> np.ndarray:
    """(T, 4, H, W) u, v, p and the obstacle's mask of a wave travelling downstream, one period every
    PERIOD frames (synthetic, not a solver's flow)."""
    y, x = np.mgrid[: SIM.ny, : SIM.nx]
    mask = (x - SIM.cx) ** 2 + (y - SIM.cy) ** 2 <= (SIM.size / 2) ** 2
    frames = np.zeros((count, 4, SIM.ny, SIM.nx), np.float32)
    for t in range(count):
        w = np.sin(2 * np.pi * 3 * x / SIM.nx - 2 * np.pi * t / PERIOD) * np.sin(np.pi * (y + 0.5) / SIM.ny)
        frames[t, :3] = np.stack([0.067 + 0.02 * w, 0.02 * w, 0.001 * w])
        frames[t, :3, mask] = 0.0
        frames[t, 3] = mask
    return frames


def rolled(frames: np.ndarray, steps: int, lead: int) -> dict:
    """The summary of a rollout whose 'network' returns the reference ``lead`` stored frames ahead."""
    codec = StepCodec(Normalizer(center=[0.0] * 3, scale=[1.0] * 3))
    calls = iter(range(1, steps + 1))
    score = RolloutScore(0.25)
    for _ in roll(lambda state, cond: frames[next(calls) + lead, :3].copy(), codec, frames, SIM, 1, steps, score):
        pass
    return score.summary()


def test_an_oracle_one_frame_ahead_is_found_one_step_ahead_with_the_right_frequency():
    frames = synthetic_frames(80)
    assert reference_period(frames, SIM, 0) == pytest.approx(PERIOD, rel=1e-3)
    assert wake_probes(SIM) == [(16, 24), (16, 30), (16, 36)] and wake_box(SIM) == (slice(1, 31), slice(18, 64))
    s = rolled(frames, 60, lead=1)
    assert s["final_lag_steps"] == 1.0 and s["final_rel_l2_vorticity_lagged"] < 1e-6  # the phase, and nothing but the phase
    # a lead of 1/15 period: 2 sin(pi / 15) of the travelling part (less, relative to the obstacle's steady shear as well)
    assert 0.2 < s["final_rel_l2_vorticity"] < 2 * np.sin(np.pi / PERIOD)
    assert s["horizon_vorticity_lagged"] == 60
    assert s["frequency_rel_error_phase"] == pytest.approx(0.0, abs=1e-3)  # a constant lead: the right frequency
    assert s["phase_lag_final"] == pytest.approx(1 / PERIOD, abs=3e-3)
    assert s["acdm_mse_60"] > 0 and s["acdm_mse_60_inc_units"] > 0 and s["mgn_rmse_1"] > 0 and np.isnan(s["mgn_rmse_600"])


def test_without_two_periods_of_reference_there_is_no_lag_window():
    s = rolled(synthetic_frames(12), 8, lead=0)
    assert np.isnan(s["horizon_vorticity_lagged"]) and np.isnan(s["final_lag_steps"]) and np.isnan(s["frequency_rel_error_phase"])
    assert s["final_rel_l2_vorticity"] == 0.0 and s["horizon_vorticity_lowpass"] == 8


@pytest.mark.parametrize("hold, constrained", [(False, False), (True, False), (False, True)])
def test_holding_the_inflow_sets_the_inlet_velocity_back_and_nothing_else(hold, constrained):
    """A 'network' that drifts everywhere: with hold_inflow, or for a model trained under the constraints, the inlet
    column's u and v are the first frame's after every step (its pressure and every other cell keep the prediction);
    the obstacle is zeroed either way."""
    frames = synthetic_frames(10)
    codec = StepCodec(Normalizer(center=[0.0] * 3, scale=[1.0] * 3), constrain=constrained)
    steps = list(roll(lambda state, cond: state[:3] + 0.01, codec, frames, SIM, 1, 3, RolloutScore(0.25), hold_inflow=hold))
    hold = hold or constrained
    mask = frames[0, 3] > 0.5
    last = steps[-1].pred  # (3, H, W): three drifts of 0.01 from the first frame
    assert np.all(last[:, mask] == 0.0)
    inlet = frames[0, :2, :, 0] if hold else frames[0, :2, :, 0] + 0.03
    np.testing.assert_allclose(last[:2, :, 0], inlet, atol=1e-6)
    np.testing.assert_allclose(last[2, :, 0], frames[0, 2, :, 0] + 0.03, atol=1e-6)
    np.testing.assert_allclose(last[:, :, 1][:, ~mask[:, 1]], (frames[0, :3, :, 1] + 0.03)[:, ~mask[:, 1]], atol=1e-6)
