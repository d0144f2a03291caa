"""Slurm's time formats: parse a time limit, print an elapsed time. Pure."""
import re

_FORMS = [
    # D-H, D-H:M, D-H:M:S
    (re.compile(r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$"), ("d", "h", "m", "s")),
    # M, M:S, H:M:S
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d+)$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("h", "m", "s")),
]
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
UNLIMITED = ("unlimited", "infinite", "UNLIMITED", "INFINITE")

VALID_FORMS = "M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"


def parse_duration(text: str) -> int:
    """Seconds for a Slurm time string; 0 for UNLIMITED. Raises ValueError naming the forms."""
    text = text.strip()
    if text in UNLIMITED:
        return 0
    for pattern, units in _FORMS:
        match = pattern.match(text)
        if match:
            total = sum(int(v) * _SECONDS[u] for v, u in zip(match.groups(), units) if v is not None)
            if total <= 0:
                raise ValueError(f"time {text!r} is zero; give a positive time ({VALID_FORMS})")
            return total
    raise ValueError(f"time {text!r} is not one of {VALID_FORMS}")


def format_duration(seconds: float) -> str:
    """squeue's TIME column: M:SS, H:MM:SS, or D-HH:MM:SS."""
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{s:02d}"
    return f"{minutes}:{s:02d}"


def format_limit(seconds: int) -> str:
    return "UNLIMITED" if seconds == 0 else format_duration(seconds)
