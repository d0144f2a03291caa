"""Runs whose processes outlive SIGKILL ("Kill task failed", Slurm's UnkillableStepTimeout).

A process in uninterruptible sleep (a hung file system, a GPU driver in trouble) does not die at
SIGKILL until the kernel call it waits in returns. Such a run would be reported alive for ever and hold
its job: a requeued job waits for its earlier run to be gone before it starts again elsewhere. A
process with SIGKILL pending never runs another instruction of its own, so once a run the daemon is
ending has outlived its SIGKILL by `timeout_s`, and every process left of it is in uninterruptible
sleep (the agent checks, after killing them all again), the node daemon gives it up: it stops
reporting the run, reports the batch script's end, and drains the node, which an operator looks at
before resuming it. Only the daemon's own ends of a run count (a stop, a stale run, the fence), never
a signal a user sends to a job that goes on.

Pure bookkeeping with an injected clock; the agent asks `due` on every heartbeat.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

RunKey = tuple[int, int]
MAX_WATCHED = 100_000   # runs killed and not yet gone (each run of this node at most once)


class KillWatch:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self._clock = clock
        self._killed: dict[RunKey, float] = {}   # run -> when it was first sent SIGKILL
        self._given_up: set[RunKey] = set()      # runs whose processes outlived SIGKILL by timeout_s
        self._lock = threading.Lock()

    def killed(self, key: RunKey) -> None:
        """SIGKILL was sent to the run's processes (the first time counts)."""
        with self._lock:
            if key not in self._killed and len(self._killed) < MAX_WATCHED:
                self._killed[key] = self._clock()

    def due(self, alive: Iterable[RunKey]) -> list[RunKey]:
        """Of the runs still alive here, those that have outlived SIGKILL by timeout_s and are not given
        up yet (asked again at every call until they are, or end); runs no longer alive are forgotten."""
        alive = set(alive)
        now = self._clock()
        with self._lock:
            for key in [k for k in self._killed if k not in alive]:
                del self._killed[key]
            self._given_up &= alive
            if self.timeout_s <= 0:   # never give up
                return []
            return sorted(k for k, t in self._killed.items() if now - t >= self.timeout_s and k not in self._given_up)

    def give_up(self, key: RunKey) -> None:
        """The run is given up: no longer reported (until it ends, when it is forgotten)."""
        with self._lock:
            if key in self._killed:
                self._given_up.add(key)

    def given_up(self) -> set[RunKey]:
        """Runs given up and still alive (as of the last `due`): not reported as running here."""
        with self._lock:
            return set(self._given_up)

    def since(self, key: RunKey) -> float:
        """Seconds since the run was first sent SIGKILL (0 if it was not)."""
        with self._lock:
            t = self._killed.get(key)
        return 0.0 if t is None else self._clock() - t
