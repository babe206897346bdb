"""A cell's figure over its runs: the median with a 95 % bootstrap confidence interval and the number of runs."""

import math
from dataclasses import dataclass

from tasks.common.reports.reporting import fmt

CONFIDENCE = 0.95
RESAMPLES = 9999
SEED = 0  # a fixed seed: the same runs give the same interval in every report


@dataclass(frozen=True)
class Interval:
    """The median of a cell's ``n`` runs and a 95 % confidence interval [low, high] around it (NaN where n < 2).
    An infinite value is a run slower than every other (a run that missed its target, as MLPerf counts one)."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values) -> "Interval":
        """The interval of ``values`` (NaN left out; +inf kept, as the slowest): the percentile bootstrap of the median."""
        kept = sorted(float(v) for v in values if v == v)
        n = len(kept)
        if n == 0:
            return cls(math.nan, math.nan, math.nan, 0)
        median = _median(kept)
        if n == 1:
            return cls(median, math.nan, math.nan, 1)
        if kept[0] == kept[-1]:  # identical runs: nothing to resample (and the bootstrap's spread is zero)
            return cls(median, kept[0], kept[0], n)
        low, high = _bootstrap(kept)
        return cls(median, low, high, n)

    def overlaps(self, other: "Interval") -> bool:
        """Whether the two intervals share a value: the two cells tie. A cell without an interval (under 2 runs) ties with none."""
        if self.n < 2 or other.n < 2 or math.isnan(self.low) or math.isnan(other.low):
            return False
        return self.low <= other.high and other.low <= self.high

    def scaled(self, factor: float) -> "Interval":
        """The same interval in another unit (a share as a percentage)."""
        return Interval(self.median * factor, self.low * factor, self.high * factor, self.n)

    def text(self, unit: str = "") -> str:
        """``33.6 s [1.73–64.3], n=5``; ``33.6 s (1 run: no interval)``; '–' for no run."""
        if self.n == 0:
            return "–"
        median = _number(self.median) + (f" {unit}" if unit and math.isfinite(self.median) else "")
        if self.n == 1:
            return f"{median} (1 run: no interval)"
        if math.isinf(self.low):  # every run missed
            return f"{median}, n={self.n}"
        return f"{median} [{_number(self.low)}–{_number(self.high)}], n={self.n}"

    def as_dict(self) -> dict:
        """For JSON (which has no NaN or infinity): the bounds are null without an interval, and 'not reached' for +inf."""
        def value(v: float):
            return None if math.isnan(v) else "not reached" if math.isinf(v) else v
        return {"median": value(self.median), "low": value(self.low), "high": value(self.high), "n": self.n}


def _number(v: float) -> str:
    return "not reached" if math.isinf(v) and v > 0 else fmt(v)


def _median(kept: list[float]) -> float:
    mid = len(kept) // 2
    return kept[mid] if len(kept) % 2 else (kept[mid - 1] + kept[mid]) / 2  # inf + x stays inf


def _bootstrap(kept: list[float]) -> tuple[float, float]:
    """The percentile bootstrap interval of the median of sorted ``kept``, which may end in +inf."""
    import numpy as np
    from scipy.stats import bootstrap

    finite = [v for v in kept if math.isfinite(v)]
    if not finite:
        return math.inf, math.inf
    # A missed run (+inf) is resampled as a finite stand-in far above every reached value; a bound above the largest
    # reached value came from one, so it is +inf again. The percentile method takes the bootstrap medians' quantiles as
    # they are: BCa's acceleration would be driven by the stand-in, and it degenerates on samples this small with ties.
    top = max(finite)
    stand_in = abs(top) * 1e9 + 1e9
    data = np.array([v if math.isfinite(v) else stand_in for v in kept])
    result = bootstrap((data,), np.median, confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method="percentile",
                       rng=np.random.default_rng(SEED))
    low, high = (float(b) for b in (result.confidence_interval.low, result.confidence_interval.high))
    return (math.inf if low > top else low), (math.inf if high > top else high)
