"""The commands' summaries as strict JSON: a non-finite number (NaN, infinity) is null, never a bare NaN a parser refuses."""

import json
import math
import numbers
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every number a plain int or float and every non-finite float None, through dicts, lists and tuples."""
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None


def json_line(summary: Any, indent: int | None = None) -> str:
    """``summary`` as strict JSON (one line unless ``indent``); objects JSON has no type for as their text."""
    return json.dumps(finite(summary), indent=indent, default=str, allow_nan=False)
