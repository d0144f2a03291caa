"""The runs this node has given up on ("Kill task failed"), kept in the spool across daemon restarts.

A run is given up once what is left of it has outlived SIGKILL by unkillable_timeout_s in
uninterruptible sleep: the node drains, and an operator looks at what is stuck before resuming it. A
daemon started again later finds the same processes in the run's group and would watch them anew, and
drain the node a second time, also where the operator had resumed it knowing of them. It reads this
record instead: a group given up before is still killed and removed once it empties, but not drained
for again. A run is recorded only once the controller has taken the drain for it (a daemon stopped
before then drains again: a node is never left undrained). The record is root's file in the root-only spool, written aside and renamed into place,
of at most MAX_KEPT runs; what it holds of runs whose group has gone is dropped when a daemon starts.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from air.airnoded import jobfiles
from air.protos.limits import is_number

log = logging.getLogger("airnoded")

FILE = "given-up"
MAX_KEPT = 1000
RunKey = tuple[int, int]


class GivenUp:
    def __init__(self, spool: Path):
        self._spool = spool
        self._lock = threading.Lock()
        self._runs: set[RunKey] = self._read()

    def _read(self) -> set[RunKey]:
        try:
            text = jobfiles.read_root_file(self._spool, FILE, limit=32 * MAX_KEPT).decode("ascii")
        except FileNotFoundError:
            return set()
        except (OSError, UnicodeDecodeError, jobfiles.UnsafeFile) as e:
            log.warning("the record of runs given up could not be read (%s): their groups are watched anew", e)
            return set()
        runs = set()
        for line in text.splitlines():
            job, _, run = line.partition(" ")
            if is_number(job, 20) and is_number(run, 20):
                runs.add((int(job), int(run)))
        return runs

    def _write(self) -> None:
        text = "".join(f"{job} {run}\n" for job, run in sorted(self._runs))
        try:
            jobfiles.write_root_file(self._spool, FILE, text.encode("ascii"), 0o600)
        except OSError as e:   # the drain itself stands; only a later daemon would drain again
            log.warning("the record of runs given up could not be written: %s", e)

    def __contains__(self, key: RunKey) -> bool:
        with self._lock:
            return key in self._runs

    def add(self, key: RunKey) -> None:
        with self._lock:
            if key in self._runs:
                return
            if len(self._runs) >= MAX_KEPT:
                log.warning("job %d: run %d given up, not recorded (%d are): a daemon started again drains "
                            "for it again", key[0], key[1], MAX_KEPT)
                return
            self._runs.add(key)
            self._write()

    def discard(self, key: RunKey) -> None:
        with self._lock:
            if key not in self._runs:
                return
            self._runs.discard(key)
            self._write()

    def keep_only(self, keys: set[RunKey]) -> None:
        """Forget the runs not among `keys` (those whose groups are still here, as a daemon starts)."""
        with self._lock:
            if self._runs <= keys:
                return
            self._runs &= keys
            self._write()
