"""Progress reports, as a job writes them (runtime/report.py): hostile text. One reading for every
reader: a JSON object's numeric fields, nothing else."""
from __future__ import annotations

import json
import math

_INT_LIMIT = 1 << 63


def number(value) -> int | float | None:
    """An int within 64 bits or a finite float; None for anything else (bools, 10**400, NaN, text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -_INT_LIMIT <= value < _INT_LIMIT else None
    if isinstance(value, float) and math.isfinite(value):
        return value
    return None


def report_numbers(text: str) -> dict[str, int | float]:
    """The numeric fields of a report's top level, keys cut to 64 characters; {} for anything that is
    not a JSON object (too deep, too large a number for Python to read, not JSON at all)."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(raw, dict):
        return {}
    out = {}
    for key, value in raw.items():
        n = number(value)
        if n is not None:
            out[str(key)[:64]] = n
    return out
