"""Progress of long work: a Prefect progress artifact on the running flow or task run, and the time left.

Shown where users look for it: the Prefect UI, and the log line of each unit done.
"""

import logging
import time

log = logging.getLogger(__name__)


def time_left(elapsed_s: float, fraction: float) -> str:
    """'about 40 s left' / 'about 3 min left' from the time so far and the fraction done; '' before any."""
    if fraction <= 0 or fraction >= 1:
        return ""
    left = elapsed_s * (1 - fraction) / fraction
    if left < 1:
        return ""
    return f"about {left:.0f} s left" if left < 120 else f"about {left / 60:.0f} min left"


class Progress:
    """A progress artifact (0-100 %) of the current Prefect run; outside a run only the estimates."""

    def __init__(self, description: str):
        self.t0 = time.monotonic()
        self.artifact = None
        try:
            from prefect.artifacts import create_progress_artifact
            from prefect.context import FlowRunContext, TaskRunContext

            if FlowRunContext.get() or TaskRunContext.get():
                self.artifact = create_progress_artifact(0.0, description=description)
        except Exception as exc:  # progress is a courtesy: the work goes on without it
            log.debug("no progress artifact: %s", exc)

    def update(self, fraction: float) -> str:
        """Set the artifact to ``fraction`` (0 to 1); returns the time-left estimate."""
        fraction = min(1.0, max(0.0, fraction))
        if self.artifact is not None:
            try:
                from prefect.artifacts import update_progress_artifact

                update_progress_artifact(self.artifact, 100.0 * fraction)
            except Exception as exc:
                log.debug("progress artifact not updated: %s", exc)
        return time_left(time.monotonic() - self.t0, fraction)
