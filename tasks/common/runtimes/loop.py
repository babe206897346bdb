"""The one training loop: every workload in every framework trains here, from `train` and from `bench-quality` alike.

It owns what every run shares: the epochs and steps, the time budget and the stop request agreed by
every rank at the same step, the learning-rate schedule's progress, validation cadence and the
quality target, a checkpoint after every epoch and resume from it, progress events, and the summary.
What differs comes from two objects: the framework's runtime (tasks.train.runtimes: devices, the
collective that agrees, seeding, checkpoint files, memory) and the workload's trainer for that
framework (tasks.workloads: batches, one step, validation, the model's artifacts). A recorder takes
what the loop measures: MLflow for a training run, nothing for bench-quality.

Reproducibility: each epoch's order and randomness depend on (seed, epoch, rank) only, so a run
resumed from an end-of-epoch checkpoint takes the same steps as one that was never interrupted.
"""

import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Protocol, runtime_checkable

import numpy as np

from tasks.common.process import events
from tasks.common.config.errors import RunFailed, RunStopped, signal_name
from tasks.common.process.lifetime import stop_requested
from tasks.common.process.progress import time_left
from tasks.common.records import TrainSummary
from tasks.common.specs import TrainSpec
from tasks.common.runtimes.checkpoint import keep_checkpoint, plain, resumable

WARMUP_STEPS = 2  # steps of each process timed apart: tracing, compilation, allocator and cache warm-up
PROGRESS_EVERY_S = float(os.environ.get("KARMAN_PROGRESS_EVERY_S", "10"))  # within an epoch, a progress line at most this often


@runtime_checkable
class Trainer(Protocol):
    """A workload's training in one framework (tasks/workloads/NAME/FRAMEWORK.py builds one); the training job
    checks every trainer it builds against it (``missing_members``)."""

    samples: int  # training samples of an epoch
    has_validation: bool
    headline: dict[str, str]  # the validation scores an epoch's log line shows, with their words (all are in the metrics)
    flops_per_sample: float  # training FLOPs of one sample, from the network's layer shapes (for MFU)
    params: dict  # the workload's own parameters of the run's record (MLflow params)
    speed: dict  # the speed options it trains with (threads, precision, compilation), for the record

    def batches(self, epoch: int, steps: int) -> Iterator[Any]: ...  # this rank's share of each global batch, in order
    def step(self, batch: Any, flags: list[float], progress: float) -> tuple[dict[str, float], list[float]]: ...
    # one optimiser step: the global batch's mean losses, and ``flags`` averaged over every rank (one collective)
    def learning_rate(self) -> float: ...
    def state(self) -> dict: ...  # what a checkpoint holds of the model and optimisers
    def load_state(self, state: dict) -> None: ...
    def evaluate(self) -> dict[str, float]: ...  # validation scores (rank 0)
    def reached(self, scores: dict[str, float]) -> bool: ...  # the quality target holds
    def epoch_metrics(self) -> dict[str, float]: ...  # the trainer's own per-epoch measurements
    def finish(self, run_dir: Path, run, settings) -> dict[str, float] | None: ...
    # after the last epoch, rank 0: its artifacts logged to ``run`` (tasks.common.tracking.runs.Run); the test split's scores, if it scores one


def protocol_members(protocol: type) -> list[str]:
    """The attributes and methods a Protocol class declares (its annotations and its functions), in order."""
    names = list(protocol.__dict__.get("__annotations__", {}))
    return names + [k for k, v in protocol.__dict__.items() if callable(v) and not k.startswith("_") and k not in names]


def missing_members(obj, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``obj`` (an instance, or a class for its methods) lacks."""
    return [name for name in protocol_members(protocol) if not hasattr(obj, name)]


class Runtime(Protocol):
    """A framework on a device (runtime_torch.py, runtime_keras.py beside this module)."""

    framework: str
    is_main: bool
    world_size: int

    def agree(self, values: list[float]) -> list[float]: ...  # the mean over every rank (a collective)
    def seed_epoch(self, seed: int, epoch: int) -> None: ...
    def save(self, state: dict, path: Path) -> None: ...
    def load(self, path: Path) -> dict: ...
    def epoch_metrics(self, first: bool) -> dict[str, float]: ...  # peak memory, compilations


class Recorder(Protocol):
    """Where the loop's measurements go (rank 0)."""

    def steps(self, rows: list[tuple[int, dict[str, float]]]) -> None: ...
    def epoch(self, epoch: int, metrics: dict[str, float]) -> None: ...


class NoRecorder:
    """Records nothing: bench-quality and the ranks other than 0."""

    def steps(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        pass

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        pass


@dataclass
class History:
    """What a run has done so far; a checkpoint carries it, so a resumed run goes on counting."""

    epoch: int = 0
    epoch_s: list[float] = field(default_factory=list)  # each epoch's seconds
    epoch_samples: list[int] = field(default_factory=list)  # each epoch's samples: fewer than a whole epoch's where a limit cut it short
    global_step: int = 0
    train_s: float = 0.0
    samples: int = 0
    warmup_s: list[float] = field(default_factory=list)
    target: dict[str, float] | None = None
    last_losses: dict[str, float] = field(default_factory=dict)
    validation: dict[str, float] = field(default_factory=dict)
    resumes: int = 0  # times the run was resumed from its checkpoint

    def __setattr__(self, name: str, value) -> None:
        # Plain Python on the way in: a trainer's scores and losses may come as numpy or framework scalars,
        # and a checkpoint carries this record to a loader that reads plain numbers only.
        super().__setattr__(name, plain(value, where=f"history.{name}"))

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class _Logged:
    """A recorder that leaves out the epochs and steps up to ``epoch`` and ``step``: a resume from the checkpoint before a
    damaged newest one trains them again, and their metrics are in the run already."""

    def __init__(self, recorder: Recorder, epoch: int, step: int):
        self.recorder, self.through_epoch, self.through_step = recorder, epoch, step

    def steps(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        if rows := [row for row in rows if row[0] > self.through_step]:
            self.recorder.steps(rows)

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        if epoch > self.through_epoch:
            self.recorder.epoch(epoch, metrics)


METRIC_FLUSH = 50  # per-step metrics go to the recorder in batches of this many steps


class _StepRows:
    def __init__(self, recorder: Recorder):
        self.recorder, self.pending = recorder, []

    def add(self, step: int, values: dict[str, float]) -> None:
        self.pending.append((step, values))
        if len(self.pending) >= METRIC_FLUSH:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.recorder.steps(self.pending)
        self.pending = []


def train(trainer: Trainer, runtime: Runtime, recorder: Recorder, spec: TrainSpec, batch_size: int, checkpoint: Path | None,
          log: logging.Logger, resume: bool = False, run_id: str | None = None, announce: bool = True) -> TrainSummary | None:
    """Train until the epoch limit, the step limit, the time budget or (if asked) the quality target;
    rank 0 returns the summary, other ranks None. ``checkpoint``: where the state goes after every
    epoch (None: nowhere); ``resume``: start from it. ``announce``: progress events for a parent."""
    steps_per_epoch = trainer.samples // batch_size  # at least 1: the plan checked the batch against the samples
    history = History()
    if resume:
        kept = resumable(checkpoint)
        if kept.warning and runtime.is_main:
            log.warning("%s", kept.warning)
        state = runtime.load(kept.path)
        trainer.load_state(state["model"])
        history = History(**state["history"])
        history.resumes += 1
        log.info("resuming after epoch %d (step %d) from %s", history.epoch, history.global_step, kept.path)
        if kept.logged_epoch > history.epoch:  # the epochs trained again were logged by the run before: once is enough
            recorder = _Logged(recorder, kept.logged_epoch, kept.logged_step)
    rows = _StepRows(recorder)
    progress = _Progress(log, runtime.is_main and announce)
    # Training time runs on across a resume: the clock starts where the checkpoint's left off.
    clock_t0 = time.perf_counter() - history.train_s
    warmup_t0, session_steps, warmup_s = time.perf_counter(), 0, None
    train_s = history.train_s  # the ranks' agreed training time, for the schedule
    stopping = None  # why training ends before its epoch limit: "time budget" or "target reached"
    for epoch in range(history.epoch + 1, spec.epoch_limit + 1):
        runtime.seed_epoch(spec.seed, epoch)
        t_epoch, data_s, sums, counts, done = time.perf_counter(), 0.0, {}, {}, 0
        batches = trainer.batches(epoch, steps_per_epoch)
        try:
            for step in range(steps_per_epoch):
                t0 = time.perf_counter()
                batch = next(batches)
                t1 = time.perf_counter()
                # Every rank must stop at the same step and use the same learning rate: the budget's
                # verdict, a stop request and the training time travel with the losses.
                elapsed = time.perf_counter() - clock_t0
                over = float(spec.time_budget is not None and elapsed >= spec.time_budget)
                signalled = stop_requested()  # SIGTERM or SIGINT: every rank stops after the same step
                fraction = spec.progress(train_s, history.global_step, steps_per_epoch)
                values, (over, stop, train_s) = trainer.step(batch, [over, float(signalled or 0), elapsed], fraction)
                t2 = time.perf_counter()
                data_s += t1 - t0
                history.global_step, session_steps, done = history.global_step + 1, session_steps + 1, done + 1
                if session_steps == WARMUP_STEPS:
                    warmup_s = t2 - warmup_t0
                _check_finite(values, epoch, history.global_step, checkpoint, rows)
                for k, v in values.items():  # a key may be absent from some steps (a curriculum's later loss terms)
                    sums[k], counts[k] = sums.get(k, 0.0) + v, counts.get(k, 0) + 1
                rows.add(history.global_step, {f"step_{k}": v for k, v in values.items()} | {"step_time_s": t2 - t0})
                progress.step(epoch, step + 1, steps_per_epoch, spec.progress(train_s, history.global_step, steps_per_epoch), train_s)
                if stop > 0:
                    rows.flush()
                    raise _stopped(signalled, epoch, history.global_step, checkpoint, run_id)
                if spec.max_steps and history.global_step >= spec.max_steps:
                    break
                if over > 0:
                    stopping = "time budget"
                    break
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # stops a reader thread on a break or an error
        epoch_s = time.perf_counter() - t_epoch
        history.epoch, history.samples = epoch, history.samples + done * batch_size
        history.epoch_s.append(epoch_s)
        history.epoch_samples.append(done * batch_size)
        history.last_losses = {k: v / counts[k] for k, v in sums.items()}
        metrics = {"epoch_time_s": epoch_s, "epoch_samples_per_s": done * batch_size / epoch_s, "data_wait_fraction": data_s / epoch_s,
                   "learning_rate": trainer.learning_rate(), **runtime.epoch_metrics(epoch == 1), **trainer.epoch_metrics(),
                   **{f"epoch_{k}": v for k, v in history.last_losses.items()}}
        rows.flush()
        at_step_limit = bool(spec.max_steps and history.global_step >= spec.max_steps)
        last_epoch = stopping is not None or epoch == spec.epoch_limit or at_step_limit
        reached = 0.0
        if runtime.is_main and trainer.has_validation and spec.validate_every > 0 and (epoch % spec.validate_every == 0 or last_epoch):
            reached = _validate(trainer, history, epoch, clock_t0, metrics, spec.stop_at_target, log)
        if runtime.world_size > 1:  # rank 0 judged the target: every rank stops with it
            reached = runtime.agree([reached])[0]
        if reached > 0 and stopping is None:
            stopping = "target reached"
        history.train_s = time.perf_counter() - clock_t0
        metrics["train_time_s"] = history.train_s
        if runtime.is_main:
            recorder.epoch(epoch, metrics)
            if checkpoint is not None:  # the newest, the one before kept beside it
                keep_checkpoint(runtime.save, {"model": trainer.state(), "history": history.as_dict()}, checkpoint)
        ends = stopping is not None or last_epoch
        fraction = 1.0 if ends else spec.progress(history.train_s, history.global_step, steps_per_epoch)
        progress.epoch(epoch, metrics, history.last_losses, fraction, history.train_s, trainer.headline)
        if at_step_limit:
            stopping = stopping or "step limit"
            break
        if stopping is not None:
            log.info("training stops after epoch %d: %s (%.1f s of training)", epoch, stopping, history.train_s)
            break
    history.warmup_s.append(warmup_s if warmup_s is not None else float("nan"))
    if not runtime.is_main:
        return None
    return summary(history, steps_per_epoch * batch_size, stopping or "epoch limit")


def _validate(trainer: Trainer, history: History, epoch: int, clock_t0: float, metrics: dict, stop_at_target: bool, log) -> float:
    """Score validation into the epoch's ``metrics`` and, the first time the target holds, the time to
    target into ``history`` (validation counts as training time); 1.0 if training should stop at it."""
    scores = trainer.evaluate()
    train_s = time.perf_counter() - clock_t0
    history.validation = scores
    metrics |= {f"val_{k}": v for k, v in scores.items() if math.isfinite(v)}
    if not trainer.reached(scores) or history.target is not None:
        return 0.0
    history.target = {"time_to_target_s": train_s, "epochs_to_target": epoch, "samples_to_target": history.samples}
    metrics |= history.target
    log.info("quality target reached after %.1f s, epoch %d, %d samples", train_s, epoch, history.samples)
    return float(stop_at_target)


def epoch_rate(history: History, samples_per_epoch: int) -> tuple[float, float]:
    """(seconds per whole epoch, samples per second) of a run, the first epoch (the warm-up) left out when
    there are more: the median of the whole epochs among the rest; where none of them ran whole (a step
    limit or a time budget cut it short), their samples over their seconds, as a whole epoch would take."""
    known = history.epoch_samples
    counts = [samples_per_epoch] * (len(history.epoch_s) - len(known)) + known  # a checkpoint written before epochs were counted
    epochs = list(zip(history.epoch_s, counts))
    steady = epochs[1:] or epochs
    whole = [seconds for seconds, n in steady if n >= samples_per_epoch]
    if whole:
        time_per_epoch = float(np.median(whole))
        return time_per_epoch, samples_per_epoch / time_per_epoch
    rate = sum(n for _, n in steady) / sum(seconds for seconds, _ in steady)
    return samples_per_epoch / rate, rate


def summary(history: History, samples_per_epoch: int, ended_by: str) -> TrainSummary:
    """The finished run's summary: its epoch time and samples per second as ``epoch_rate`` measures them."""
    time_per_epoch, samples_per_s = epoch_rate(history, samples_per_epoch)
    target = history.target or {}
    finite = lambda v: v if v is not None and math.isfinite(v) else None  # noqa: E731
    return TrainSummary(
        epochs=len(history.epoch_s), steps=history.global_step, warmup_s=finite(float(np.nansum(history.warmup_s))),
        time_per_epoch_s=time_per_epoch, samples_per_s=samples_per_s, train_time_s=history.train_s,
        samples_seen=history.samples, final_losses={k: finite(v) for k, v in history.last_losses.items()},
        target_reached=history.target is not None, time_to_target_s=target.get("time_to_target_s"),
        epochs_to_target=target.get("epochs_to_target"), samples_to_target=target.get("samples_to_target"),
        validation={k: finite(v) for k, v in history.validation.items()}, ended_by=ended_by, resumes=history.resumes)


def _check_finite(values: dict[str, float], epoch: int, global_step: int, checkpoint: Path | None, rows: _StepRows) -> None:
    """RunFailed naming the step and the losses if any loss is not finite (the step metrics so far are sent first)."""
    if all(math.isfinite(v) for v in values.values()):
        return
    rows.flush()
    kept = (f"the last good checkpoint (epoch {epoch - 1}) is kept at {checkpoint}" if checkpoint is not None and checkpoint.exists()
            else "no checkpoint was written yet")
    raise RunFailed(f"loss became non-finite at epoch {epoch}, step {global_step} "
                    f"({', '.join(f'{k}={v:.4g}' for k, v in values.items())}); {kept}")


def _stopped(signalled: int | None, epoch: int, global_step: int, checkpoint: Path | None, run_id: str | None) -> RunStopped:
    """The error a run stopped by a signal ends with: where it stopped, what is kept, how to go on."""
    saved = checkpoint is not None and checkpoint.exists()
    kept = f"the checkpoint of epoch {epoch - 1} is kept" if saved else "no checkpoint was written yet"
    again = f"resume with python -m flows train --resume {run_id}" if saved and run_id else "start it afresh"
    return RunStopped(f"stopped by {signal_name(signalled or signal.SIGTERM)} at epoch {epoch}, step {global_step}; {kept}; {again}")


class _Progress:
    """Progress for people (log lines) and for the parent (events): within an epoch at most every
    PROGRESS_EVERY_S, so that a long epoch is not silent, and at each epoch's end."""

    def __init__(self, log: logging.Logger, enabled: bool, every_s: float = PROGRESS_EVERY_S):
        self.log, self.enabled, self.every_s, self.last = log, enabled, every_s, time.monotonic()

    def step(self, epoch: int, step: int, steps: int, fraction: float, train_s: float) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < self.every_s or step == steps:  # the epoch's own line follows the last step
            return
        self.last = now
        left = time_left(train_s, fraction)
        self.log.info("epoch %d: step %d/%d; %.0f%% done%s", epoch, step, steps, 100 * fraction, f", {left}" if left else "")
        events.emit(events.PROGRESS, fraction=fraction, epoch=epoch, step=step, steps=steps)

    def epoch(self, epoch: int, metrics: dict, losses: dict, fraction: float, train_s: float, headline: dict[str, str]) -> None:
        self.last = time.monotonic()  # the next line within an epoch comes a whole interval later
        if not self.enabled:
            return
        left = time_left(train_s, fraction)
        scores = [f"{words} {metrics['val_' + name]:.3g}" for name, words in headline.items() if "val_" + name in metrics]
        self.log.info("epoch %d: %.1f s, %.2f samples/s, %s, data wait %.1f%%%s; %.0f%% done%s", epoch, metrics["epoch_time_s"],
                      metrics["epoch_samples_per_s"], ", ".join(f"{k.removeprefix('loss_')} {v:.4g}" for k, v in sorted(losses.items())),
                      100 * metrics["data_wait_fraction"], f", validation: {', '.join(scores)}" if scores else "",
                      100 * fraction, f", {left}" if left else "")
        events.emit(events.PROGRESS, fraction=fraction, epoch=epoch, step=None, steps=None)
