"""Points in time as sacct's -S/-E take them, and timestamps as Slurm prints them. Pure (the clock
is an argument).

Forms (from sacct(1)): HH:MM[:SS][AM|PM], MMDD[YY][-HH:MM[:SS]], MM/DD[/YY][-HH:MM[:SS]],
MM.DD[.YY][-HH:MM[:SS]], YYYY-MM-DD[THH:MM[:SS]],
today, midnight, noon, elevenses (11:00), fika (15:00), teatime (16:00), tomorrow, now, and
now[{+|-}COUNT[seconds|minutes|hours|days|weeks]] (seconds when no unit is given)."""
from __future__ import annotations

import datetime as dt
import re

FORMS = ("HH:MM[:SS][AM|PM], MMDD[YY][-HH:MM[:SS]], MM/DD[/YY][-HH:MM[:SS]], MM.DD[.YY][-HH:MM[:SS]], "
         "YYYY-MM-DD[THH:MM[:SS]], today, midnight, "
         "noon, teatime, tomorrow, now or now[+|-]COUNT[seconds|minutes|hours|days|weeks]")
_UNITS = {"": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
          "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400,
          "w": 604800, "week": 604800, "weeks": 604800}
_NAMED = {"midnight": 0, "elevenses": 11, "noon": 12, "fika": 15, "teatime": 16}
_RELATIVE = re.compile(r"^now(?:([+-])(\d+)([a-z]*))?$")
_ISO = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:t(\d{1,2}):(\d{2})(?::(\d{2}))?)?$")
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?(am|pm)?$")
_DAY = re.compile(r"^(\d{1,2})([/.])(\d{1,2})(?:\2(\d{2}|\d{4}))?$")
_PACKED = re.compile(r"^(\d{2})(\d{2})(\d{2})?$")


class TimeError(ValueError):
    pass


def parse(text: str, now: float, tz: dt.tzinfo | None = None) -> float:
    """Seconds since the epoch for `text`, in local time (or `tz`). Raises TimeError naming the forms."""
    spec = text.strip().lower()
    here = dt.datetime.fromtimestamp(now, tz)
    midnight = here.replace(hour=0, minute=0, second=0, microsecond=0)
    try:
        if m := _RELATIVE.match(spec):
            sign, count, unit = m.groups()
            if sign is None:
                return now
            if unit not in _UNITS:
                raise TimeError(f"unknown unit {unit!r}")
            return now + (1 if sign == "+" else -1) * int(count) * _UNITS[unit]
        if spec == "today":
            return midnight.timestamp()
        if spec == "tomorrow":
            return (midnight + dt.timedelta(days=1)).timestamp()
        if spec in _NAMED:
            return midnight.replace(hour=_NAMED[spec]).timestamp()
        if m := _ISO.match(spec):
            y, mo, d, h, mi, s = (int(v) if v else 0 for v in m.groups())
            return here.replace(year=y, month=mo, day=d, hour=h, minute=mi, second=s, microsecond=0).timestamp()
        if m := _CLOCK.match(spec):
            h, mi, s, half = m.groups()
            hour = int(h)
            if half:
                if not 1 <= hour <= 12:
                    raise TimeError(f"hour {hour} with {half.upper()}")
                hour = hour % 12 + (12 if half == "pm" else 0)
            return midnight.replace(hour=hour, minute=int(mi), second=int(s or 0)).timestamp()
        day, dash, clock = spec.partition("-")   # MM/DD[/YY]-HH:MM[:SS] and the other day forms
        c = _CLOCK.match(clock) if dash else None
        if dash and (c is None or c.group(4) or int(c.group(1)) > 23 or int(c.group(2)) > 59
                     or int(c.group(3) or 0) > 59):
            raise TimeError("not a time of day after the -")
        if m := (_DAY.match(day) or _PACKED.match(day)):
            mo, d, y = (m.group(1), m.group(3), m.group(4)) if m.re is _DAY else m.groups()
            at = _date(here, int(mo), int(d), y)
            if c:
                at += int(c.group(1)) * 3600 + int(c.group(2)) * 60 + int(c.group(3) or 0)
            return at
    except ValueError as e:   # a day or hour out of range
        raise TimeError(f"{text!r} is not a time: {e}") from None
    raise TimeError(f"{text!r} is not a time; give {FORMS}")


def _date(here: dt.datetime, month: int, day: int, year: str | None) -> float:
    y = here.year if year is None else (int(year) + 2000 if len(year) == 2 else int(year))
    return here.replace(year=y, month=month, day=day, hour=0, minute=0, second=0, microsecond=0).timestamp()


def stamp(t: float, tz: dt.tzinfo | None = None) -> str:
    """2026-11-26T17:19:34, as sacct prints times; Unknown for none."""
    if not t:
        return "Unknown"
    return dt.datetime.fromtimestamp(t, tz).strftime("%Y-%m-%dT%H:%M:%S")
