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
count, or by the next full collection if it is in a cycle."""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

BULK = 1000

_lock = threading.Lock()
_pausing = 0          # changes under way that paused it
_resume = False       # whether it ran before the first of them


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
