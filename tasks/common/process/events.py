"""Structured events from a child job to its parent: one JSON object per line of the child's stdout, never log text.

The parent reads progress and the job's verdict from these lines, so a log line can be reworded
freely. An event line is ``{"karman_event": KIND, ...fields}``; fields are strict JSON (a value
that does not exist, such as a NaN score, is null).
"""

import json
import math
import sys

KEY = "karman_event"
PROGRESS = "progress"  # {"fraction": 0..1, "epoch": E, "step": S, "steps": N}
VERDICT = "verdict"  # {"kind": "user" | "failed" | "stopped" | "crash", "message": one line}


def strict(value):
    """``value`` with every non-finite float (NaN, ±inf), at any depth, replaced by None: strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def emit(event: str, /, **fields) -> None:
    """Write the event ``event`` as one line to stdout (flushed at once; one write, so lines of other writers never split it)."""
    sys.stdout.write(json.dumps({KEY: event, **strict(fields)}, allow_nan=False) + "\n")
    sys.stdout.flush()


def parse(line: str) -> dict | None:
    """The event a line of child output holds, or None for any other line (log text)."""
    if not line.startswith("{") or KEY not in line:
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get(KEY), str) else None
