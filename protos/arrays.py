"""Job arrays (--array), pure: parse the index spec, and print task ids compactly.

    0-99        every index from 0 to 99
    1,5,9       a list
    0-99:4      every fourth: 0, 4, 8, ...
    ...%8       at most 8 tasks of the array run at once
"""
from __future__ import annotations

MAX_INDEX = 100_000
MAX_TASKS = 10_000


def parse(text: str) -> tuple[list[int], int]:
    """(sorted task indices, throttle or 0); ValueError names the bad part and the valid forms."""
    spec, pct, throttle = text.strip().partition("%")
    limit = 0
    if pct:
        if not throttle.isdecimal() or int(throttle) < 1:
            raise ValueError(f"--array={text!r}: the throttle after % must be a whole number of at least 1")
        limit = int(throttle)
    indices: set[int] = set()
    for part in spec.split(","):
        rng, colon, step = part.partition(":")
        lo, dash, hi = rng.partition("-")
        # (isdecimal: what int() reads, as admission took it; a stored spec is read again at each launch)
        if not lo.isdecimal() or (dash and not hi.isdecimal()) or (colon and not step.isdecimal()):
            raise ValueError(f"--array={text!r}: {part!r} is not N, N-M or N-M:S (such as 0-99, 1,5,9 or 0-99:4%8)")
        first, last = int(lo), int(hi) if dash else int(lo)
        every = int(step) if colon else 1
        if last < first or every < 1:
            raise ValueError(f"--array={text!r}: {part!r} is an empty range")
        if last > MAX_INDEX:
            raise ValueError(f"--array={text!r}: indices go up to {MAX_INDEX}")
        indices.update(range(first, last + 1, every))
        if len(indices) > MAX_TASKS:
            raise ValueError(f"--array={text!r}: at most {MAX_TASKS} tasks in one array")
    return sorted(indices), limit


def compact(indices) -> str:
    """1,2,3,5,7,8,9 -> "1-3,5,7-9"."""
    out = []
    run_start = prev = None
    for i in sorted(indices):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if run_start is not None:
            out.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
        run_start = prev = i
    if run_start is not None:
        out.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
    return ",".join(out)
