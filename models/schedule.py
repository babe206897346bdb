"""The learning-rate schedule every workload shares: the rate's multiplier over a run (constant or half a cosine) and how far a run is."""

import math

SCHEDULES = ("constant", "cosine")
LR_FLOOR = 0.01  # the cosine schedule ends at this fraction of the initial rate


def lr_factor(schedule: str, progress: float) -> float:
    """Multiplier of the initial learning rate at ``progress`` (0 at the start, 1 at the end of the run;
    clipped to [0, 1])."""
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        p = min(max(progress, 0.0), 1.0)
        return LR_FLOOR + (1 - LR_FLOOR) * 0.5 * (1 + math.cos(math.pi * p))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}; choose {' or '.join(SCHEDULES)}")


def schedule_progress(train_s: float, step: int, time_budget: float | None, total_steps: int | None) -> float:
    """How far a run is, 0 to 1: training time over the time budget or optimiser steps over the run's
    step limit, whichever is further (a run ends at the first limit it reaches)."""
    return max(train_s / time_budget if time_budget else 0.0, step / total_steps if total_steps else 0.0)
