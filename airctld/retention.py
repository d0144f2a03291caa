"""Keeping the store bounded: what is old goes, a little at a time.

- Ended jobs' progress reports are thinned once the job has ended: the first and the last, and
  the first of each minute (`report_sample_s`) in between. While a job runs, every report stays.
- Job events and node health events older than `events_keep_days` go, but for the event that
  says who cancelled a job (airacct shows it for as long as the job is kept).
- Jobs that ended more than `jobs_keep_days` ago go whole: their row, events, earlier runs,
  steps and reports.

Every step is one small transaction (at most `BATCH` rows, or about `REPORT_ROWS` reports), so a
submission waits for the store no longer than one such step takes; a pass runs steps until nothing
is left to do or its time is spent, and the controller's maintenance thread runs one pass a
minute (at once again while work is left). Cursors kept in the store's meta table carry the
work across restarts, so no pass walks what an earlier one has done.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from air.airctld.store import Store

log = logging.getLogger("airctld")

BATCH = 200                 # rows one step removes at most (events: written in order, a few pages)
REPORT_ROWS = 60            # reports one step looks at: a job's reports lie one to a page among others'
                            # (every page a step touches is written again, and synced)
JOBS_AT_ONCE = 20           # ended jobs one step removes, once their reports, steps and events are gone
SETTLE_S = 60.0             # a job's reports are thinned once it has ended this long ago (late ones in)
DAY = 86400.0


@dataclass(frozen=True)
class Limits:
    events_keep_s: float = 30 * DAY
    jobs_keep_s: float = 365 * DAY
    report_sample_s: float = 60.0


def limits(cc) -> Limits:
    """From the [controller] section."""
    return Limits(events_keep_s=cc.events_keep_days * DAY, jobs_keep_s=cc.jobs_keep_days * DAY,
                  report_sample_s=cc.report_sample_s)


@dataclass
class Done:
    reports: int = 0
    events: int = 0
    node_events: int = 0
    jobs: int = 0
    steps: int = 0          # transactions
    more: bool = False      # stopped for time with work left

    @property
    def rows(self) -> int:
        return self.reports + self.events + self.node_events + self.jobs


def run_pass(store: Store, limits: Limits, now: float, budget_s: float = 0.2,
             clock: Callable[[], float] = time.perf_counter) -> Done:
    """Rounds of steps, one of each kind with work left, until none is left or `budget_s` is spent."""
    done = Done()
    until = clock() + budget_s
    work = [lambda: _thin_reports(store, limits, now, done), lambda: _purge_events(store, limits, now, done),
            lambda: _purge_node_events(store, limits, now, done), lambda: _purge_jobs(store, limits, now, done)]
    while work:   # rounds of one step of each kind with work left: none waits behind another
        if done.steps and clock() >= until:   # (at least one round a pass)
            done.more = True
            return done
        for step in list(work):
            done.steps += 1
            if not step():
                work.remove(step)
    return done


def _meta(store: Store, key: str) -> float:
    rows = store.db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchall()
    return rows[0][0] if rows else 0.0


def _set_meta(store: Store, key: str, value: float) -> None:
    store.db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                     [key, value])


def _thin_reports(store: Store, limits: Limits, now: float, done: Done) -> bool:
    """One hour of one ended job's reports; True while there is more to do. The cursor: the last job
    done (its end time and id, jobs taken in that order), and how far into the next one it got."""
    with store.transaction():
        end, last_job = _meta(store, "thin_end"), int(_meta(store, "thin_job"))
        rows = store.db.execute(
            # (end_time >= the cursor's seeds the index range; an OR would walk the index from 0)
            "SELECT id, end_time FROM jobs INDEXED BY jobs_end WHERE end_time >= ?2 AND end_time > 0 "
            "AND end_time < ?1 AND NOT (end_time = ?2 AND id <= ?3) AND phase = 4 ORDER BY end_time, id LIMIT 1",
            [now - SETTLE_S, end, last_job]).fetchall()
        if not rows:
            return False
        job, job_end = rows[0]
        within = _meta(store, "thin_within") if int(_meta(store, "thin_within_job")) == job else 0.0
        ends = store.db.execute(   # (by the index on job and time: a long job's reports are not all read)
            "SELECT (SELECT rowid FROM reports WHERE job_id = ?1 ORDER BY time, rowid LIMIT 1), "
            "(SELECT rowid FROM reports WHERE job_id = ?1 ORDER BY time DESC, rowid DESC LIMIT 1), "
            "(SELECT min(time) FROM reports WHERE job_id = ?1), (SELECT max(time) FROM reports WHERE job_id = ?1)",
            [job]).fetchone()
        first, last, earliest, latest = ends
        stop = latest
        if first is not None and within <= latest:
            start = within or earliest
            # a window of about REPORT_ROWS reports (at least to the next sample boundary), ending on a
            # sample boundary: no minute is split between two steps
            sample = limits.report_sample_s
            nth = store.db.execute("SELECT time FROM reports WHERE job_id = ? AND time >= ? ORDER BY time "
                                   "LIMIT 1 OFFSET ?", [job, start, REPORT_ROWS]).fetchone()
            stop = max(math.floor(nth[0] / sample) * sample, (start // sample + 1) * sample) if nth \
                else (latest // sample + 1) * sample
            if stop <= start:   # (forward, whatever the floats round to; a boundary otherwise, never
                stop = start + sample   # start + sample: that split the minute `start` is in)
            cur = store.db.execute(
                "DELETE FROM reports WHERE job_id = ? AND time >= ? AND time < ? AND rowid NOT IN (?, ?) "
                "AND rowid NOT IN (SELECT min(rowid) FROM reports WHERE job_id = ? AND time >= ? AND time < ? "
                "GROUP BY CAST(time / ? AS INTEGER))",
                [job, start, stop, first, last, job, start, stop, limits.report_sample_s])
            done.reports += cur.rowcount
        if first is None or stop > latest:   # this job is done: on to the next
            _set_meta(store, "thin_end", job_end)
            _set_meta(store, "thin_job", job)
            _set_meta(store, "thin_within_job", 0)
        else:
            _set_meta(store, "thin_within_job", job)
            _set_meta(store, "thin_within", stop)
    return True


def _purge_by_id(store: Store, table: str, cursor: str, cutoff: float, keep: str, done_field: str,
                 done: Done) -> bool:
    """Rows of an append-only table, oldest id first, up to the first that is not older than
    `cutoff` (ids grow with time, near enough: a row a little out of order waits for the next)."""
    with store.transaction():
        after = int(_meta(store, cursor))
        rows = store.db.execute(f"SELECT id, time FROM {table} WHERE id > ? ORDER BY id LIMIT ?",
                                [after, BATCH]).fetchall()
        old = 0
        for _, t in rows:
            if t is not None and t >= cutoff:   # (no time: a NaN an earlier version stored, as SQLite keeps
                break                           # it; taken as old)
            old += 1
        if not old:
            return False
        upto = rows[old - 1][0]
        cur = store.db.execute(f"DELETE FROM {table} WHERE id > ? AND id <= ?{keep}", [after, upto])
        setattr(done, done_field, getattr(done, done_field) + cur.rowcount)
        _set_meta(store, cursor, upto)
    return old == len(rows)


def _purge_events(store: Store, limits: Limits, now: float, done: Done) -> bool:
    # who cancelled a job is kept with the job (airacct's "CANCELLED by UID")
    return _purge_by_id(store, "events", "events_purged", now - limits.events_keep_s,
                        " AND reason != 'CANCELLED'", "events", done)


def _purge_node_events(store: Store, limits: Limits, now: float, done: Done) -> bool:
    return _purge_by_id(store, "node_events", "node_events_purged", now - limits.events_keep_s, "",
                        "node_events", done)


def _purge_jobs(store: Store, limits: Limits, now: float, done: Done) -> bool:
    """The next jobs that ended before the cutoff: up to BATCH rows of what they have (reports,
    steps, events, earlier runs; a job may have thousands), or, once they have none, the jobs."""
    with store.transaction():
        ids = [r for (r,) in store.db.execute(
            "SELECT id FROM jobs INDEXED BY jobs_end WHERE end_time > 0 AND end_time < ? AND phase = 4 "
            "ORDER BY end_time LIMIT ?", [now - limits.jobs_keep_s, JOBS_AT_ONCE]).fetchall()]
        if not ids:
            return False
        marks = ", ".join("?" * len(ids))
        for table, rows in (("reports", REPORT_ROWS), ("steps", BATCH), ("events", BATCH), ("runs", BATCH)):
            cur = store.db.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
                                   f"WHERE job_id IN ({marks}) LIMIT {rows})", ids)
            if cur.rowcount:
                return True
        store.db.execute(f"DELETE FROM jobs WHERE id IN ({marks})", ids)
        done.jobs += len(ids)
    return True


class Maintenance:
    """The controller's maintenance thread: a retention pass a minute, at once again while work is left."""

    def __init__(self, store: Store, limits: Limits, clock: Callable[[], float] = time.time,
                 interval_s: float = 60.0, budget_s: float = 0.2, on_pass: Callable[[Done], None] | None = None):
        self.store = store
        self.limits = limits
        self.clock = clock
        self.interval_s = interval_s
        self.budget_s = budget_s
        self.on_pass = on_pass
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="retention", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop after the pass in progress, waiting up to wait_s for it (the store may be closed then)."""
        self._stop.set()
        if self._thread is not None and wait_s:
            self._thread.join(wait_s)

    def run(self) -> None:
        while not self._stop.is_set():
            more = False
            try:
                done = run_pass(self.store, self.limits, self.clock(), self.budget_s)
                more = done.more
                if done.rows:
                    log.info("retention: %d reports thinned, %d events, %d node events and %d jobs removed "
                             "(%d steps)%s", done.reports, done.events, done.node_events, done.jobs, done.steps,
                             "; more to do" if more else "")
                if self.on_pass is not None:
                    self.on_pass(done)
            except Exception:   # a store that fails now may not later; nothing else depends on this
                log.exception("retention pass failed")
            # while work is left, a short pause between passes: other writers go first
            self._stop.wait(1.0 if more else self.interval_s)
