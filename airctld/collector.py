"""Python's cyclic garbage collector, paused while airctld changes many jobs at once.

Cancelling 100,000 jobs makes hundreds of thousands of objects (the jobs' new versions, the rows
written, the events) that all live until the change is committed. Each of them counts towards the
collector's next run, and every full run walks every object of a job table of that size: about a third
of such a cancel's time went to collections that found nothing to free (job objects hold no cycles).
The collector is paused for changes of BULK jobs or more and runs again (at its next threshold) once
the last of them has ended. Changes of fewer jobs never pause it, so a steady flow of them cannot keep
it paused. A collector found off when the first pause began stays off after it.

What was made during a pause is moved to the oldest generation when the collector runs again
(gc.freeze then gc.unfreeze: no object is walked). Left young, the first allocations after a cancel
of 100,000 jobs set off a young collection that walked them all, then the next generation's, then a
full one: a quarter of a second, on the reply's way out, that freed nothing. What lives on (the jobs'
new versions) belongs to the oldest generation anyway; what is garbage is freed by its reference
count, or, in a cycle, by the full collection that `settle` runs from the controller's loop
SETTLE_S after the first bulk change since the last such collection (Python would otherwise start one only once the oldest
generation grew by a quarter, towards which what was moved there does not count)."""
from __future__ import annotations

import contextlib
import gc
import threading
import time
from typing import Iterator

BULK = 1000
SETTLE_S = 10.0   # after a bulk change: a full collection, for the cycles it moved unwalked

_lock = threading.Lock()
_pausing = 0          # changes under way that paused it
_resume = False       # whether it ran before the first of them
_owed: float | None = None   # (monotonic) when a bulk change first moved young objects, since the last settle


@contextlib.contextmanager
def paused(jobs: int) -> Iterator[None]:
    """Pause the collector while a change of `jobs` jobs runs, if that is BULK or more."""
    global _pausing, _resume
    if jobs < BULK:
        yield
        return
    with _lock:
        if not _pausing:
            _resume = gc.isenabled()
            gc.disable()
        _pausing += 1
    try:
        yield
    finally:
        with _lock:
            _pausing -= 1
            if not _pausing and _resume:
                gc.freeze()    # (every tracked object, the pause's included, to the permanent generation,
                gc.unfreeze()  # then all of it to the oldest: nothing walked, no young collection owed)
                gc.enable()
                global _owed
                _owed = _owed or time.monotonic()   # (the earliest: bulk changes every few seconds cannot put it off)


def settle(now: float | None = None) -> bool:
    """A full collection, once SETTLE_S have passed since a bulk change first moved objects to the
    oldest generation unwalked (whatever cycles were among them are freed); whether it ran. For a
    loop that runs between requests, not on their way."""
    global _owed
    now = time.monotonic() if now is None else now
    with _lock:
        if _owed is None or _pausing or now - _owed < SETTLE_S or not gc.isenabled():
            return False
        _owed = None
    gc.collect()
    return True
