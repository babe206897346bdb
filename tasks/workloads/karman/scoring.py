"""The Kármán workload's scored autoregressive rollout loop, shared by the rollout stage, training's validation and bench-quality."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.karman.flow_metrics import RolloutScore
from models.karman.rollout_diagnostics import LagWindow, phase_frequency
from models.karman.solver import vorticity
from tasks.workloads.karman.data import StepCodec, load_frames, with_condition
from tasks.workloads.karman.simulation import SimulationSpec


def wake_probes(sim: SimulationSpec) -> list[tuple[int, int]]:
    """(row, col) on the obstacle's centre line two, three and four obstacle sizes downstream, inside
    the frame (where v swings at the shedding frequency)."""
    row = min(max(int(round(sim.cy)), 0), sim.ny - 1)
    return [(row, min(int(round(sim.cx + d * sim.size)), sim.nx - 1)) for d in (2, 3, 4)]


def probe_point(sim: SimulationSpec) -> tuple[int, int]:
    """(row, col) two obstacle sizes downstream of the obstacle's centre, inside the frame."""
    return wake_probes(sim)[0]


def wake_box(sim: SimulationSpec) -> tuple[slice, slice]:
    """The wake region the band errors are taken on: every row between the channel walls, from one
    obstacle size behind the obstacle's centre to the outlet."""
    return slice(1, sim.ny - 1), slice(min(int(round(sim.cx + sim.size)), sim.nx - 2), sim.nx)


def reference_period(frames: np.ndarray, sim: SimulationSpec, start: int) -> float:
    """The reference's shedding period in stored frames, from the phase of v at the first wake probe
    over the frames from ``start`` on; NaN if they hold too few periods."""
    row, col = wake_probes(sim)[0]
    frequency = phase_frequency(frames[start:, 1, row, col], 1.0)
    return 1.0 / frequency if frequency == frequency and frequency > 0 else float("nan")


class ReferenceWindows:
    """For each rollout step, the reference vorticity at every stored frame within half a shedding
    period of the step's own reference (clipped to the stored frames), each computed once."""

    def __init__(self, frames: np.ndarray, sim: SimulationSpec, mask: np.ndarray, start: int, stride: int):
        self.frames, self.mask, self.start, self.stride = frames, mask, start, stride
        period = reference_period(frames, sim, start)
        self.half = int(round(period / 2)) if period == period else None
        self.cache: dict[int, np.ndarray] = {}

    def at(self, n: int) -> LagWindow | None:
        """The window of step ``n`` (None where the reference's period is unknown)."""
        if self.half is None:
            return None
        centre = self.start + n * self.stride
        picks = [i for i in range(centre - self.half, centre + self.half + 1) if 0 <= i < len(self.frames)]
        for i in [i for i in self.cache if i < picks[0]]:
            del self.cache[i]  # the window only moves forward
        for i in picks:
            if i not in self.cache:
                self.cache[i] = vorticity(self.frames[i, 0], self.frames[i, 1], self.mask)
        return LagWindow(np.stack([self.cache[i] for i in picks]), (np.array(picks) - centre) / self.stride)


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
         stride: int, steps: int, score: RolloutScore, start: int = 0, hold_inflow: bool = False) -> Iterator[Step]:
    """Roll a network out from ``frames[start]`` (frames: (T, 4, H, W) physical u, v, p, mask; a
    conditioned model's Reynolds number a fifth channel) for ``steps`` steps of ``stride`` frames, scoring each against the reference into ``score``.
    ``predict(state, cond)`` maps the physical state (4 or 5, H, W) and its network-unit encoding to the
    next physical state (3, H, W); velocities and pressure inside the obstacle are zeroed after it, and
    with ``hold_inflow`` (or a codec of a model trained under these constraints) u and v of the inlet column
    (x = 0) are set back to the first frame's."""
    hold_inflow = hold_inflow or codec.constrain
    first = frames[start]  # (4 or 5, H, W)
    mask = first[3] > 0.5
    fluid = ~mask
    w_start = vorticity(first[0], first[1], mask)
    probe, probes, wake = probe_point(sim), wake_probes(sim), wake_box(sim)
    windows = ReferenceWindows(frames, sim, mask, start, stride)
    state = first.copy()
    for n in range(1, steps + 1):
        pred = predict(state, codec.norm.encode(state))  # (3, H, W) physical
        pred[:, mask] = 0.0
        if hold_inflow:
            pred[:2, :, 0] = first[:2, :, 0]
        state = np.concatenate([pred, first[3:]])  # the mask (and a condition) as they were
        ref = frames[start + n * stride, :3]
        w_pred, w_ref = vorticity(pred[0], pred[1], mask), vorticity(ref[0], ref[1], mask)
        metrics = score.add(pred, ref, first[:3], w_pred, w_ref, w_start, probe, fluid, windows.at(n), probes, wake)
        yield Step(n, pred, ref, w_pred, w_ref, metrics)


def load_simulation(dataset_dir: Path, manifest: dict, sim_id: str, condition: str = "none") -> tuple[np.ndarray, SimulationSpec]:
    """A stored simulation's frames (T, 4, H, W), or (T, 5, H, W) with its Reynolds number for a model
    conditioned on it, and its spec, from the dataset's manifest."""
    sim = SimulationSpec(**manifest["simulations"][sim_id]["spec"])
    return with_condition(load_frames(dataset_dir, sim_id), sim.reynolds if condition == "reynolds" else None), sim


def score_forward(forward: Callable[[np.ndarray], np.ndarray], codec: StepCodec, frames: np.ndarray, sim: SimulationSpec, stride: int,
                  steps: int, threshold_u: float = 0.1, threshold_vorticity: float = 0.3) -> RolloutScore:
    """Roll a network out for ``steps`` steps from the first frame of ``frames`` (T, 4, H, W) and return
    its filled score; ``forward`` maps one encoded state (4 or 5, H, W) to the network's output (3, H, W)
    (any framework)."""
    def predict(state: np.ndarray, cond: np.ndarray) -> np.ndarray:
        return codec.next_state(state, forward(cond))

    score = RolloutScore(step_time(sim, stride), threshold_u, threshold_vorticity)
    for _ in roll(predict, codec, frames, sim, stride, rollout_steps(len(frames), 0, stride, steps), score):
        pass
    return score


def torch_forward(generator, device) -> Callable[[np.ndarray], np.ndarray]:
    """``forward`` of score_forward for a torch generator (in eval mode, on ``device``)."""
    import torch

    def forward(cond: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return generator(torch.from_numpy(cond[None]).to(device)).float().cpu().numpy()[0]  # (3, H, W)
    return forward


def score_generator(generator, device, codec: StepCodec, frames: np.ndarray, sim: SimulationSpec, stride: int, steps: int,
                    threshold_u: float = 0.1, threshold_vorticity: float = 0.3) -> RolloutScore:
    """score_forward for a torch generator (in eval mode, on ``device``)."""
    return score_forward(torch_forward(generator, device), codec, frames, sim, stride, steps, threshold_u, threshold_vorticity)


@dataclass
class Validation:
    """Rollouts of the generator on the validation simulations during training, scored against them;
    the quality target: vorticity relative L2 at most ``target_vorticity`` for the first
    ``target_steps`` steps of every validation rollout."""

    sims: list  # [(frames (T, 4 or 5, H, W), SimulationSpec)]
    codec: StepCodec
    net: object  # the generator's NetConfig (for a CPU copy of an XLA generator)
    stride: int
    every: int
    steps: int
    target_vorticity: float
    target_steps: int

    @classmethod
    def of(cls, dataset_dir: Path, manifest: dict, sim_ids: list[str], codec: StepCodec, net, stride: int, every: int,
           steps: int, target_vorticity: float, target_steps: int, condition: str = "none") -> "Validation":
        sims = [load_simulation(dataset_dir, manifest, s, condition) for s in sim_ids]
        return cls(sims, codec, net, stride, every, steps, target_vorticity, target_steps)

    def due(self, epoch: int, last: bool) -> bool:
        return bool(self.sims) and self.every > 0 and (epoch % self.every == 0 or last)

    def score(self, generator, ctx) -> dict[str, float]:
        """The worst case over the validation simulations of each rollout score."""
        import torch

        from models.karman.nets.pix2pix import build_generator

        if ctx.kind == "xla":  # a CPU copy: one-frame batches would not shard over the mesh
            copy = build_generator(self.net)
            copy.load_state_dict({k: v.detach().cpu() for k, v in generator.state_dict().items()})
            generator = copy
        device = torch.device("cpu") if ctx.kind == "xla" else ctx.device
        was_training = generator.training
        generator.eval()
        try:
            return self.score_forward(torch_forward(generator, device))
        finally:
            generator.train(was_training)

    def score_forward(self, forward: Callable[[np.ndarray], np.ndarray]) -> dict[str, float]:
        """The worst case over the validation simulations of each rollout score (``forward`` as in score_forward)."""
        results = [score_forward(forward, self.codec, frames, sim, self.stride, self.steps,
                                 threshold_vorticity=self.target_vorticity).summary() for frames, sim in self.sims]
        def worst_of(key: str, pick) -> float:  # NaN (not measurable in one of them: too short a rollout) stays NaN
            values = [r[key] for r in results]
            return float("nan") if any(v != v for v in values) else pick(values)

        worst = {key: worst_of(key, max) for key in ("one_step_rel_l2_u", "one_step_rel_l2_vorticity", "strouhal_rel_error",
                                                    "mean_rel_l2_vorticity", "energy_ratio_max_deviation", "acdm_mse_60")}
        return worst | {key: worst_of(key, min) for key in ("horizon_u", "horizon_vorticity", "correlation_periods",
                                                            "horizon_vorticity_lagged", "horizon_vorticity_lowpass")}

    def reached(self, quality: dict) -> bool:
        return quality["horizon_vorticity"] >= self.target_steps
