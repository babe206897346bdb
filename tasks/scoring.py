"""Autoregressive rollouts scored against a reference simulation: the loop shared by the rollout
child (tasks.rollout) and the validation rollouts during training (tasks.training)."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from models.flow_metrics import RolloutScore
from models.solver import vorticity
from tasks.data import StepCodec
from tasks.simulate import SimulationSpec


def probe_point(sim: SimulationSpec) -> tuple[int, int]:
    """(row, col) two obstacle sizes downstream of the obstacle's centre, inside the frame."""
    return (min(max(int(round(sim.cy)), 0), sim.ny - 1), min(int(round(sim.cx + 2 * sim.size)), sim.nx - 1))


def step_time(sim: SimulationSpec, frame_stride: int) -> float:
    """Time between rollout steps in convective units D/U (obstacle size over mean inflow)."""
    return frame_stride * sim.frame_every * sim.flow_config().u_mean / sim.size


def rollout_steps(frames: int, start: int, stride: int, wanted: int) -> int:
    """Steps of at most ``wanted`` that fit in a simulation of ``frames`` frames from ``start``."""
    return max(0, min(wanted, (frames - 1 - start) // stride))


@dataclass
class Step:
    """One rollout step: predicted and reference states (3, H, W) physical, their vorticity (H, W) and
    the step's scores (relative L2 per field, vorticity correlation, energy ratio)."""

    n: int
    pred: np.ndarray
    ref: np.ndarray
    w_pred: np.ndarray
    w_ref: np.ndarray
    metrics: dict


def roll(predict: Callable[[np.ndarray, np.ndarray], np.ndarray], codec: StepCodec, frames: np.ndarray, sim: SimulationSpec,
         stride: int, steps: int, score: RolloutScore, start: int = 0) -> Iterator[Step]:
    """Roll a network out from ``frames[start]`` (frames: (T, 4, H, W) physical u, v, p, mask) for
    ``steps`` steps of ``stride`` frames, scoring each against the reference into ``score``.
    ``predict(state, cond)`` maps the physical state (4, H, W) and its network-unit encoding to the
    next physical state (3, H, W); velocities and pressure inside the obstacle are zeroed after it."""
    first = frames[start]  # (4, H, W)
    mask = first[3] > 0.5
    fluid = ~mask
    w_start = vorticity(first[0], first[1], mask)
    probe = probe_point(sim)
    state = first.copy()
    for n in range(1, steps + 1):
        pred = predict(state, codec.norm.encode(state))  # (3, H, W) physical
        pred[:, mask] = 0.0
        state = np.concatenate([pred, first[3:4]])
        ref = frames[start + n * stride, :3]
        w_pred, w_ref = vorticity(pred[0], pred[1], mask), vorticity(ref[0], ref[1], mask)
        metrics = score.add(pred, ref, first[:3], w_pred, w_ref, w_start, probe, fluid)
        yield Step(n, pred, ref, w_pred, w_ref, metrics)
