"""The controller's durable state: one SQLite database in WAL mode.

Every change happens inside `transaction()` (BEGIN IMMEDIATE, commit or roll back as a
whole); every job state change writes an event row beside it. Job ids come from an
AUTOINCREMENT key, so they grow and are never reused, across restarts too. The schema
carries its version in PRAGMA user_version and migrates forward on open.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import hostlist
import sqlite_utils

from air.airctld import history
from air.airctld.errors import StoreFailed
from air.airctld.fairshare import Assoc
from air.airctld.model import Job, Node, NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, JobResult, NodeState, Reason, long_state

_JOB_COLUMNS = ("uid", "gid", "user", "name", "partition", "num_nodes", "gpus_per_node",
                "cpus_per_node", "time_limit_s", "submit_time", "priority", "phase", "result",
                "reason", "reason_detail", "hold", "allocation", "start_time", "end_time",
                "exit_code", "exit_signal", "restart_count", "last_stop_reason", "array_job_id",
                "array_task_id", "figures", "request")


def _migrate_1(db: sqlite_utils.Database) -> None:
    db.execute("""
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            uid INTEGER NOT NULL, gid INTEGER NOT NULL, user TEXT NOT NULL, name TEXT NOT NULL,
            partition TEXT NOT NULL, num_nodes INTEGER NOT NULL, gpus_per_node INTEGER NOT NULL,
            cpus_per_node INTEGER NOT NULL, time_limit_s INTEGER NOT NULL, submit_time REAL NOT NULL,
            priority INTEGER NOT NULL, phase INTEGER NOT NULL, result INTEGER NOT NULL,
            reason INTEGER NOT NULL, reason_detail TEXT NOT NULL, hold INTEGER NOT NULL,
            allocation TEXT NOT NULL, start_time REAL NOT NULL, end_time REAL NOT NULL,
            exit_code INTEGER NOT NULL, exit_signal INTEGER NOT NULL, request BLOB NOT NULL)""")
    db.execute("CREATE INDEX jobs_active ON jobs (phase) WHERE phase != 4")
    db.execute("CREATE INDEX jobs_end ON jobs (end_time)")
    db["events"].create({"id": int, "job_id": int, "time": float, "old_state": str, "new_state": str,
                         "reason": str, "detail": str, "who": int}, pk="id")
    db["events"].create_index(["job_id"])
    db["nodes"].create({"name": str, "address": str, "cpus": int, "memory_mb": int, "gpus": bytes,
                        "state": int, "reason": str, "last_heartbeat": float}, pk="name")


def _migrate_2(db: sqlite_utils.Database) -> None:
    """Node health history."""
    db["node_events"].create({"id": int, "node": str, "time": float, "gpu": int, "signal": str,
                              "message": str, "critical": int}, pk="id")
    db["node_events"].create_index(["node", "time"])


def _migrate_3(db: sqlite_utils.Database) -> None:
    """Requeue: how many times a job restarted, and why it last stopped."""
    db.execute("ALTER TABLE jobs ADD COLUMN restart_count INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE jobs ADD COLUMN last_stop_reason INTEGER NOT NULL DEFAULT 0")


def _migrate_4(db: sqlite_utils.Database) -> None:
    """Arrays, the account tree and fairshare usage."""
    db.execute("ALTER TABLE jobs ADD COLUMN array_job_id INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE jobs ADD COLUMN array_task_id INTEGER NOT NULL DEFAULT 0")
    db.execute("CREATE INDEX jobs_array ON jobs (array_job_id) WHERE array_job_id != 0")
    db.execute("""
        CREATE TABLE assocs (
            account TEXT NOT NULL, user TEXT NOT NULL, parent TEXT NOT NULL,
            shares INTEGER NOT NULL, max_gpus INTEGER NOT NULL, PRIMARY KEY (account, user))""")
    db.execute("""
        CREATE TABLE usage (
            account TEXT NOT NULL, user TEXT NOT NULL, raw REAL NOT NULL, PRIMARY KEY (account, user))""")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value REAL NOT NULL)")


def _migrate_5(db: sqlite_utils.Database) -> None:
    """Which health signal drained a node, so that it may return by itself once that clears."""
    db.execute("ALTER TABLE nodes ADD COLUMN drain_signal TEXT NOT NULL DEFAULT ''")


def _migrate_6(db: sqlite_utils.Database) -> None:
    """Jobs' progress reports, for airstat."""
    db.execute("CREATE TABLE reports (job_id INTEGER NOT NULL, time REAL NOT NULL, report TEXT NOT NULL)")
    db.execute("CREATE INDEX reports_job ON reports (job_id, time)")


def _migrate_7(db: sqlite_utils.Database) -> None:
    """Preemption state a pass decides and later passes count on: the nodes held for each pending
    preemptor, and when each stopping job was asked to stop (its grace runs from then)."""
    db.execute("CREATE TABLE preempt_holds (job_id INTEGER PRIMARY KEY, nodes TEXT NOT NULL)")
    db.execute("CREATE TABLE stop_times (job_id INTEGER PRIMARY KEY, time REAL NOT NULL)")


def _migrate_8(db: sqlite_utils.Database) -> None:
    """Which jobs each preemptor has preempted: it never preempts the same job twice (a preemptor
    held and released, or requeued, would otherwise take its victim again and again)."""
    db.execute("CREATE TABLE preemptions (preemptor INTEGER NOT NULL, victim INTEGER NOT NULL, "
               "PRIMARY KEY (preemptor, victim))")


def _migrate_9(db: sqlite_utils.Database) -> None:
    """Each step of a job (airrun), written when it is created: its number is never given twice, a
    controller restart included, and the job's history keeps it."""
    db.execute("CREATE TABLE steps (job_id INTEGER NOT NULL, step_id INTEGER NOT NULL, run INTEGER NOT NULL, "
               "created REAL NOT NULL, nodes TEXT NOT NULL, ntasks INTEGER NOT NULL, command TEXT NOT NULL, "
               "PRIMARY KEY (job_id, step_id))")


def _migrate_10(db: sqlite_utils.Database) -> None:
    """Job history (airacct): the account and QOS of each job as columns to filter on, each earlier
    run of a requeued job, and the indexes history's queries use (a user's or an account's jobs
    that ended after a time)."""
    db.execute("ALTER TABLE jobs ADD COLUMN account TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE jobs ADD COLUMN qos TEXT NOT NULL DEFAULT ''")
    last = 0
    while True:   # a thousand requests at a time: a request may hold megabytes of script
        batch = db.execute("SELECT id, request FROM jobs WHERE id > ? ORDER BY id LIMIT 1000", [last]).fetchall()
        if not batch:
            break
        updates = [(req.account, req.qos, job_id) for job_id, blob in batch
                   if (req := pb.JobRequest.FromString(blob)).account or req.qos]
        db.conn.executemany("UPDATE jobs SET account = ?, qos = ? WHERE id = ?", updates)
        last = batch[-1][0]
        del batch
    db.execute("CREATE INDEX jobs_uid_end ON jobs (uid, end_time)")
    db.execute("CREATE INDEX jobs_account_end ON jobs (account, end_time)")
    db.execute("CREATE TABLE runs (job_id INTEGER NOT NULL, run INTEGER NOT NULL, start_time REAL NOT NULL, "
               "end_time REAL NOT NULL, allocation TEXT NOT NULL, reason INTEGER NOT NULL, "
               "detail TEXT NOT NULL, exit_code INTEGER NOT NULL, exit_signal INTEGER NOT NULL, "
               "PRIMARY KEY (job_id, run))")


def _migrate_11(db: sqlite_utils.Database) -> None:
    """Goodput: the runtime's figures of each run that ended (the job's last one on the job's row)."""
    db.execute("ALTER TABLE jobs ADD COLUMN figures TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE runs ADD COLUMN figures TEXT NOT NULL DEFAULT ''")


def _migrate_12(db: sqlite_utils.Database) -> None:
    """Each step's own outcome, as airrun reports it when the step ends (0 end_time: not reported)."""
    db.execute("ALTER TABLE steps ADD COLUMN end_time REAL NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE steps ADD COLUMN exit_code INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE steps ADD COLUMN exit_signal INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE steps ADD COLUMN cancelled INTEGER NOT NULL DEFAULT 0")


def _migrate_13(db: sqlite_utils.Database) -> None:
    """The end-time indexes hold ended jobs only (every query of them asks for `phase = 4`, literally:
    SQLite uses a partial index only for a query whose WHERE implies the index's). A job that ends,
    a cancel of 100,000 pending jobs say, then adds one entry to each, where it moved one (a delete
    and an insert), and a submission adds none."""
    for name, columns in (("jobs_end", "end_time"), ("jobs_uid_end", "uid, end_time"),
                          ("jobs_account_end", "account, end_time")):
        db.execute(f"DROP INDEX {name}")
        db.execute(f"CREATE INDEX {name} ON jobs ({columns}) WHERE phase = 4")


def _migrate_14(db: sqlite_utils.Database) -> None:
    """Each node's health events its last heartbeat taken carried (their daemon's boot id and start, and
    their numbers, comma-separated): a controller restarted after that heartbeat's commit, before the
    node sends them again (its answer lost), takes them once all the same (NodeReports._health_not_taken)."""
    db.execute("CREATE TABLE IF NOT EXISTS health_taken (node TEXT PRIMARY KEY, boot_id TEXT NOT NULL, "
               "started_ns TEXT NOT NULL, numbers TEXT NOT NULL)")   # (a uint64: beyond SQLite's INTEGER)


MIGRATIONS = [_migrate_1, _migrate_2, _migrate_3, _migrate_4, _migrate_5, _migrate_6, _migrate_7, _migrate_8,
              _migrate_9, _migrate_10, _migrate_11, _migrate_12, _migrate_13, _migrate_14]
SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(Exception):
    pass


def _failure(e: sqlite3.Error) -> str:
    return f"the controller could not write its store: {e}; nothing was changed"


class Store:
    def __init__(self, path: str):
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self.path = path if path == ":memory:" else os.path.abspath(path)
        self.db = sqlite_utils.Database(conn)
        self._lock = threading.RLock()
        self._depth = 0
        self._on_commit: list[Callable[[], None]] = []
        self.on_commit_time: Callable[[float], None] | None = None   # seconds from BEGIN to COMMIT
        if path != ":memory:":
            self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA busy_timeout=30000")
        self._migrate()
        # (scratch rows of a bulk change, in this connection's own temporary database: see _update_alike)
        self.db.execute("CREATE TEMP TABLE changing (id INTEGER PRIMARY KEY, priority INTEGER NOT NULL)")

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"the database has schema version {version}, newer than this airctld "
                             f"knows ({SCHEMA_VERSION}); run a newer airctld")
        for number in range(version, SCHEMA_VERSION):
            with self.transaction():
                MIGRATIONS[number](self.db)
                self.db.execute(f"PRAGMA user_version = {number + 1}")

    def close(self) -> None:
        self.db.conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT; rolled back whole on any error, a failed COMMIT included. Nests
        as one. A failure of SQLite itself (disk full, I/O error) is raised as StoreFailed; the work
        given to after_commit runs only once the outermost transaction has committed."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            try:
                self.db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise StoreFailed(_failure(e)) from e
            self._depth, self._on_commit = 1, []
            began = time.perf_counter()
            try:
                try:
                    yield
                    self.db.execute("COMMIT")
                except BaseException as e:
                    self._rollback()
                    if isinstance(e, sqlite3.Error):
                        raise StoreFailed(_failure(e)) from e
                    raise
                done, self._on_commit = self._on_commit, []
                took = time.perf_counter() - began
            finally:
                self._depth, self._on_commit = 0, []
            if self.on_commit_time is not None:
                try:
                    self.on_commit_time(took)
                except Exception:   # a metric never undoes a commit
                    pass
            for fn in done:
                fn()

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run `fn` (taking a change into memory) once the outermost transaction commits, never if it
        rolls back; at once outside a transaction."""
        with self._lock:
            if self._depth:
                self._on_commit.append(fn)
                return
        fn()

    def _rollback(self) -> None:
        if self.db.conn.in_transaction:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:   # SQLite has rolled back by itself (it does on some I/O errors)
                pass

    @contextlib.contextmanager
    def reader(self) -> Iterator[sqlite3.Connection]:
        """A read-only connection of its own, for long reads that must not hold the store's lock
        (WAL: it sees the last commit and never blocks a writer). In memory: the one connection."""
        if self.path == ":memory:":
            with self._lock:
                yield self.db.conn
            return
        conn = sqlite3.connect(Path(self.path).as_uri() + "?mode=ro", uri=True, timeout=30)
        try:
            conn.execute("BEGIN")   # one snapshot for the jobs and their details
            yield conn
        finally:
            conn.close()

    def history(self, req: pb.HistoryRequest, limit: int, max_bytes: int = 4 << 20) -> tuple[list[pb.HistoryJob], bool]:
        """Jobs for airacct (see airctld.history), each with its earlier runs, steps and canceller,
        never a script or environment; at most `limit` jobs and about `max_bytes` (at least one
        job), and whether more matched."""
        out, size = [], 0
        with self.reader() as conn:
            ids, more = history.matching_ids(conn, req, limit)
            for i in range(0, len(ids), history.ROWS_AT_ONCE):   # a few jobs, whole, at a time
                jobs = [_job_from_row(row) for row in history.rows(conn, ids[i:i + history.ROWS_AT_ONCE],
                                                                   ", ".join(_JOB_COLUMNS))]
                for job in jobs:
                    for name in ("script", "environment"):
                        job.request.ClearField(name)
                runs, steps, cancelled = history.details(conn, [j.job_id for j in jobs], with_steps=not req.no_steps)
                for job in jobs:
                    entry = pb.HistoryJob(job=job.to_proto(), runs=runs.get(job.job_id, ()),
                                          steps=steps.get(job.job_id, ()))
                    if job.job_id in cancelled:
                        entry.cancelled, entry.cancelled_by = True, cancelled[job.job_id]
                    size += entry.ByteSize() + 8
                    if out and size > max_bytes:   # the rest on the next page
                        return out, True
                    out.append(entry)
        return out, more

    def _rows(self, sql: str, params=()) -> list[tuple]:
        """A read, whole, under the store's lock: never in the middle of another thread's transaction
        (its writes not yet committed, or a rollback that would abort the read)."""
        with self._lock:
            return self.db.execute(sql, params).fetchall()

    # ------------------------------------------------------------ jobs

    def insert_job(self, job: Job, who: int) -> int:
        """Store a new job (its job_id is ignored) and return the id it was given."""
        cur = self.db.execute(
            f"INSERT INTO jobs ({', '.join(_JOB_COLUMNS)}, account, qos) "
            f"VALUES ({', '.join('?' * (len(_JOB_COLUMNS) + 2))})",
            [*_job_values(job), job.request.SerializeToString(), job.request.account, job.request.qos])
        job_id = cur.lastrowid
        self._event(job_id, job.submit_time, "", long_state(job.phase, job.result), job.reason,
                    "submitted", who)
        return job_id

    def update_job(self, old: Job, new: Job, now: float, who: int) -> None:
        self.update_jobs([(old, new)], now, who)

    def update_jobs(self, changes: list[tuple[Job, Job]], now: float, who: int,
                    alike: Mapping[str, object] | None = None) -> None:
        """Write jobs' new states, an event row for each whose state changed, and a run row for each
        run that ended in a requeue (the job's row goes on with its next run).

        `alike`: a bulk change of pending jobs (a cancel of 100,000): the fields in which every new
        version differs from its old one, and their values, the same for all. They are written with one
        statement for all the jobs and one for their events, where a row at a time took three times as
        long. Every job must be pending, and leave pending: such a job ends no run, so it has no figures
        or run row to write, and its event's reason is its own (ValueError otherwise, before any write)."""
        if alike is not None:
            return self._update_alike(changes, now, who, alike)
        rows, events, runs = [], [], []
        for old, new in changes:
            if new.restart_count > old.restart_count and old.start_time > 0:
                runs.append((old.job_id, old.restart_count, old.start_time, now, _allocation_text(old),
                             int(new.last_stop_reason), new.reason_detail, new.exit_code, new.exit_signal,
                             new.figures))
            rows.append((*_job_values(new), new.job_id))
            if old.phase == new.phase and old.result == new.result and old.hold == new.hold:
                continue   # (the same state: no event)
            old_state, new_state = long_state(old.phase, old.result), long_state(new.phase, new.result)
            if old_state != new_state or old.phase != new.phase or old.hold != new.hold:
                why = new.reason
                if new.phase == JobPhase.PENDING and old.phase in (JobPhase.RUNNING, JobPhase.COMPLETING):
                    why = new.last_stop_reason   # requeued: why its run stopped
                events.append((new.job_id, now, old_state, new_state, _REASON_NAME.get(why) or Reason(why).name,
                               new.reason_detail, who))
        self.db.conn.executemany(f"UPDATE jobs SET {', '.join(c + ' = ?' for c in _JOB_COLUMNS[:-1])} WHERE id = ?",
                                 rows)
        self.db.conn.executemany("INSERT INTO events (job_id, time, old_state, new_state, reason, detail, who) "
                                 "VALUES (?, ?, ?, ?, ?, ?, ?)", events)
        self.db.conn.executemany("INSERT OR REPLACE INTO runs (job_id, run, start_time, end_time, allocation, "
                                 "reason, detail, exit_code, exit_signal, figures) "
                                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", runs)

    def _update_alike(self, changes: list[tuple[Job, Job]], now: float, who: int, alike: Mapping[str, object]):
        """update_jobs of a bulk change. Each job's priority is written too: a pass keeps pending jobs'
        in memory only, and a job's change writes it (the bulk's jobs each their own, from a scratch
        table: a statement a job is what a row at a time cost)."""
        phase = alike.get("phase")
        if not _ALIKE_NEEDED <= alike.keys() <= _ALIKE_FIELDS.keys() or phase in (None, JobPhase.PENDING) or \
                any(old.phase != _PENDING for old, _ in changes):
            raise ValueError(f"not a bulk change of pending jobs: {sorted(alike)}, to phase {phase}")
        rows = [(new.job_id, new.priority) for _, new in changes]
        if len({row[0] for row in rows}) < len(rows):   # (a job twice: as a row at a time writes it)
            return self.update_jobs(changes, now, who)
        conn = self.db.conn
        conn.execute("DELETE FROM temp.changing")   # (empty, unless an earlier one failed outside a transaction)
        conn.executemany("INSERT INTO temp.changing (id, priority) VALUES (?, ?)", rows)
        conn.execute(f"UPDATE jobs SET {', '.join(f + ' = ?' for f in alike)}, "
                     "priority = (SELECT priority FROM temp.changing AS c WHERE c.id = jobs.id) "
                     "WHERE id IN (SELECT id FROM temp.changing)", [_ALIKE_FIELDS[f](v) for f, v in alike.items()])
        conn.execute("INSERT INTO events (job_id, time, old_state, new_state, reason, detail, who) "
                     "SELECT id, ?, ?, ?, ?, ?, ? FROM temp.changing ORDER BY id",
                     [now, long_state(_PENDING, 0), long_state(phase, alike["result"]),
                      _REASON_NAME.get(alike["reason"]) or Reason(alike["reason"]).name,
                      alike["reason_detail"], who])
        conn.execute("DELETE FROM temp.changing")

    def set_pending_reasons(self, changes: Iterable[tuple[int, Reason]]) -> None:
        """Pending reasons are display state: no event row for each scheduling pass."""
        self.db.conn.executemany("UPDATE jobs SET reason = ? WHERE id = ?",
                                 [(int(r), j) for j, r in changes])

    def _event(self, job_id: int, now: float, old: str, new: str, reason: Reason, detail: str, who: int):
        self.db.execute("INSERT INTO events (job_id, time, old_state, new_state, reason, detail, who) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [job_id, now, old, new, Reason(reason).name, detail, who])

    def get_job(self, job_id: int) -> Job | None:
        rows = self._rows(f"SELECT id, {', '.join(_JOB_COLUMNS)} FROM jobs WHERE id = ?", [job_id])
        return _job_from_row(rows[0]) if rows else None

    def get_jobs(self, job_ids: list[int]) -> dict[int, Job]:
        """The stored jobs of these ids (those that exist)."""
        jobs = (_job_from_row(row) for row in self._by_ids(f"id, {', '.join(_JOB_COLUMNS)}", job_ids))
        return {job.job_id: job for job in jobs}

    def existing_ids(self, job_ids: list[int]) -> set[int]:
        """Which of these job ids the store has (no job decoded)."""
        return {row[0] for row in self._by_ids("id", job_ids)}

    def _by_ids(self, columns: str, job_ids: list[int]):
        """Rows of the jobs table for these ids, a few hundred ids a query."""
        for i in range(0, len(job_ids), 500):
            part = job_ids[i:i + 500]
            yield from self._rows(f"SELECT {columns} FROM jobs WHERE id IN ({', '.join('?' * len(part))})", part)

    def load_jobs(self, done_since: float) -> list[Job]:
        """Jobs not done, and jobs done at or after `done_since`."""
        cur = self._rows(
            f"SELECT id, {', '.join(_JOB_COLUMNS)} FROM jobs WHERE phase != 4 "
            f"UNION ALL SELECT id, {', '.join(_JOB_COLUMNS)} FROM jobs WHERE phase = 4 AND end_time >= ? "
            "ORDER BY id", [done_since])
        return [_job_from_row(r) for r in cur]

    def jobs_ended_after(self, when: float) -> list[Job]:
        """Jobs that ended after `when` (jobs_end)."""
        return [_job_from_row(r) for r in self._rows(
            f"SELECT id, {', '.join(_JOB_COLUMNS)} FROM jobs WHERE end_time > ? AND phase = 4", [when])]

    def max_job_id(self) -> int:
        rows = self._rows("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'")
        return rows[0][0] if rows else 0

    def events(self, job_id: int) -> list[dict]:
        cur = self._rows("SELECT time, old_state, new_state, reason, detail, who FROM events "
                              "WHERE job_id = ? ORDER BY id", [job_id])
        return [dict(zip(("time", "old_state", "new_state", "reason", "detail", "who"), r)) for r in cur]

    def array_tasks(self, array_job_id: int) -> list[Job]:
        cur = self._rows(f"SELECT id, {', '.join(_JOB_COLUMNS)} FROM jobs WHERE array_job_id = ? ORDER BY id",
                              [array_job_id])
        return [_job_from_row(r) for r in cur]

    def set_array_job_id(self, job_ids: list[int], array_job_id: int) -> None:
        self.db.conn.executemany("UPDATE jobs SET array_job_id = ? WHERE id = ?",
                                 [(array_job_id, i) for i in job_ids])

    def add_reports(self, rows: list[tuple[int, float, str]]) -> None:
        self.db.conn.executemany("INSERT INTO reports (job_id, time, report) VALUES (?, ?, ?)", rows)

    def reports(self, job_id: int) -> list[str]:
        return [r for (r,) in self._rows("SELECT report FROM reports WHERE job_id = ? ORDER BY time", [job_id])]

    # ------------------------------------------------------------ preemption: holds and stop times

    def save_holds(self, holds: Mapping[int, Iterable[str]]) -> None:
        """Set the nodes held for each preemptor given (replacing what it had)."""
        self.db.conn.executemany("INSERT INTO preempt_holds (job_id, nodes) VALUES (?, ?) "
                                 "ON CONFLICT(job_id) DO UPDATE SET nodes=excluded.nodes",
                                 [(j, json.dumps(sorted(n))) for j, n in holds.items()])

    def remove_holds(self, job_ids: Iterable[int]) -> None:
        self.db.conn.executemany("DELETE FROM preempt_holds WHERE job_id = ?", [(j,) for j in job_ids])

    def load_holds(self) -> dict[int, tuple[str, ...]]:
        return {j: tuple(json.loads(n)) for j, n in self._rows("SELECT job_id, nodes FROM preempt_holds")}

    def add_step(self, job_id: int, step_id: int, run: int, created: float, nodes: str, ntasks: int,
                 command: str) -> None:
        self.db.conn.execute("INSERT INTO steps (job_id, step_id, run, created, nodes, ntasks, command) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)", (job_id, step_id, run, created, nodes, ntasks, command))

    def end_step(self, job_id: int, run: int, step_id: int, ended: float, exit_code: int, exit_signal: int,
                 cancelled: bool) -> bool:
        """Record a step's end, once: False when the step is not of that run, or its end is known."""
        cur = self.db.conn.execute("UPDATE steps SET end_time = ?, exit_code = ?, exit_signal = ?, cancelled = ? "
                                   "WHERE job_id = ? AND run = ? AND step_id = ? AND end_time = 0",
                                   (ended, exit_code, exit_signal, int(cancelled), job_id, run, step_id))
        return cur.rowcount == 1

    def step_nodes(self, job_id: int, run: int) -> set[str]:
        """Every node a step of this run of the job was laid out on."""
        return {n for (nodes,) in self._rows("SELECT nodes FROM steps WHERE job_id = ? AND run = ?", [job_id, run])
                for n in hostlist.expand_hostlist(nodes)}

    def last_step_id(self, job_id: int) -> int:
        """The highest step number the job was given; -1 if it has had no step."""
        (last,), = self._rows("SELECT MAX(step_id) FROM steps WHERE job_id = ?", [job_id])
        return -1 if last is None else last

    def add_preemptions(self, pairs: Iterable[tuple[int, int]]) -> None:
        """(preemptor, victim) pairs, kept while the preemptor has not ended."""
        self.db.conn.executemany("INSERT OR IGNORE INTO preemptions (preemptor, victim) VALUES (?, ?)", list(pairs))

    def remove_preemptions(self, preemptors: Iterable[int]) -> None:
        self.db.conn.executemany("DELETE FROM preemptions WHERE preemptor = ?", [(j,) for j in preemptors])

    def load_preemptions(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for preemptor, victim in self._rows("SELECT preemptor, victim FROM preemptions"):
            out.setdefault(preemptor, set()).add(victim)
        return out

    def add_stop_times(self, times: Iterable[tuple[int, float]]) -> None:
        """When jobs were asked to stop; a job that has a time keeps it (a stop asked again does not
        restart its grace)."""
        self.db.conn.executemany("INSERT OR IGNORE INTO stop_times (job_id, time) VALUES (?, ?)", list(times))

    def remove_stop_times(self, job_ids: Iterable[int]) -> None:
        self.db.conn.executemany("DELETE FROM stop_times WHERE job_id = ?", [(j,) for j in job_ids])

    def load_stop_times(self) -> dict[int, float]:
        return dict(self._rows("SELECT job_id, time FROM stop_times"))

    # ------------------------------------------------------------ accounts and usage

    def load_assocs(self) -> list[Assoc]:
        cur = self._rows("SELECT account, user, parent, shares, max_gpus FROM assocs ORDER BY account, user")
        return [Assoc(a, u, p, s, m) for a, u, p, s, m in cur]

    def save_assoc(self, a: Assoc) -> None:
        self.db.execute("INSERT INTO assocs (account, user, parent, shares, max_gpus) VALUES (?, ?, ?, ?, ?) "
                        "ON CONFLICT(account, user) DO UPDATE SET parent=excluded.parent, shares=excluded.shares, "
                        "max_gpus=excluded.max_gpus", [a.account, a.user, a.parent, a.shares, a.max_gpus])

    def remove_assoc(self, account: str, user: str) -> None:
        self.db.execute("DELETE FROM assocs WHERE account = ? AND user = ?", [account, user])

    def load_usage(self) -> tuple[dict[tuple[str, str], float], float]:
        """Raw usage by (account, user), and the time it was decayed and charged up to (0: never)."""
        usage = {(a, u): raw for a, u, raw in self._rows("SELECT account, user, raw FROM usage")}
        rows = self._rows("SELECT value FROM meta WHERE key = 'usage_time'")
        return usage, (rows[0][0] if rows else 0.0)

    def runs_ended_after(self, when: float) -> list[tuple[int, float, float, int, int]]:
        """Runs that ended in a requeue after `when`: (job id, start, end, GPUs, CPUs of its allocation)."""
        out = []
        for job_id, start, end, allocation in self._rows(
                "SELECT job_id, start_time, end_time, allocation FROM runs WHERE end_time > ?", [when]):
            held = _allocation_from_text(allocation)
            out.append((job_id, start, end, sum(len(a.gpus) for a in held), sum(a.cpus for a in held)))
        return out

    def save_usage(self, usage: dict[tuple[str, str], float], when: float) -> None:
        self.db.conn.executemany("INSERT INTO usage (account, user, raw) VALUES (?, ?, ?) "
                                 "ON CONFLICT(account, user) DO UPDATE SET raw=excluded.raw",
                                 [(a, u, raw) for (a, u), raw in usage.items()])
        self.db.execute("INSERT INTO meta (key, value) VALUES ('usage_time', ?) "
                        "ON CONFLICT(key) DO UPDATE SET value=excluded.value", [when])

    # ------------------------------------------------------------ nodes

    def save_node(self, node: Node) -> None:
        gpus = pb.Node(gpus=node.gpus).SerializeToString()
        self.db.execute(
            "INSERT INTO nodes (name, address, cpus, memory_mb, gpus, state, reason, last_heartbeat, drain_signal) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET address=excluded.address, "
            "cpus=excluded.cpus, memory_mb=excluded.memory_mb, gpus=excluded.gpus, state=excluded.state, "
            "reason=excluded.reason, last_heartbeat=excluded.last_heartbeat, drain_signal=excluded.drain_signal",
            [node.name, node.address, node.cpus, node.memory_mb, gpus, int(node.state), node.reason,
             node.last_heartbeat, node.drain_signal])

    def add_node_events(self, node: str, events, now: float | None = None) -> None:
        """A node's health events, at the node's times, but none later than `now` (the controller's
        clock): a node whose clock runs ahead would hold up retention, which takes them in order. A time
        that is not a number (NaN, infinite) is `now` (SQLite would keep NaN as NULL, which retention
        cannot compare)."""
        self.db.conn.executemany(
            "INSERT INTO node_events (node, time, gpu, signal, message, critical) VALUES (?, ?, ?, ?, ?, ?)",
            [(node, e.time if now is None else min(e.time, now) if math.isfinite(e.time) else now, e.gpu,
              e.signal, e.message, int(e.critical)) for e in events])

    def save_health_taken(self, node: str, daemon: tuple[str, int], numbers: frozenset[int]) -> None:
        """The numbers of the health events a node's heartbeat carried, as taken (see _migrate_14)."""
        self.db.execute("INSERT OR REPLACE INTO health_taken (node, boot_id, started_ns, numbers) VALUES (?, ?, ?, ?)",
                        [node, daemon[0], str(daemon[1]), ",".join(map(str, sorted(numbers)))])

    def health_taken(self) -> dict[str, tuple[tuple[str, int], frozenset[int]]]:
        """{node: ((boot id, started_ns) of its daemon, the numbers its last heartbeat taken carried)}."""
        return {node: ((boot_id, int(started_ns)), frozenset(int(n) for n in numbers.split(",") if n))
                for node, boot_id, started_ns, numbers in
                self._rows("SELECT node, boot_id, started_ns, numbers FROM health_taken")}

    def last_report(self, job_id: int) -> str:
        rows = self._rows("SELECT report FROM reports WHERE job_id = ? ORDER BY time DESC LIMIT 1", [job_id])
        return rows[0][0] if rows else ""

    def node_events(self, node: str) -> list[dict]:
        cur = self._rows("SELECT time, gpu, signal, message, critical FROM node_events WHERE node = ? "
                              "ORDER BY id", [node])
        return [dict(zip(("time", "gpu", "signal", "message", "critical"), r)) for r in cur]

    def load_nodes(self) -> list[Node]:
        cur = self._rows("SELECT name, address, cpus, memory_mb, gpus, state, reason, last_heartbeat, "
                              "drain_signal FROM nodes ORDER BY name")
        out = []
        for name, address, cpus, memory_mb, gpus, state, reason, hb, drain_signal in cur:
            out.append(Node(name=name, address=address, cpus=cpus, memory_mb=memory_mb,
                            gpus=tuple(pb.Node.FromString(gpus).gpus), state=NodeState(state),
                            reason=reason, last_heartbeat=hb, drain_signal=drain_signal))
        return out


# the fields a bulk change may set alike (see Store.update_jobs), each with its column's type
_ALIKE_FIELDS = {"phase": int, "result": int, "reason": int, "reason_detail": str, "end_time": float,
                 "exit_code": int, "exit_signal": int}
_ALIKE_NEEDED = {"phase", "result", "reason", "reason_detail"}
_PENDING = JobPhase.PENDING   # (an enum's member read from its class costs 0.1 us: a bulk change reads it per job)
_REASON_NAME = {reason: reason.name for reason in Reason}   # (an enum's call and name: a bulk change's cost)


def _job_values(job: Job) -> tuple:
    """A job's columns, in _JOB_COLUMNS order, but its request (the last)."""
    return (job.uid, job.gid, job.user, job.name, job.partition, job.num_nodes, job.gpus_per_node,
            job.cpus_per_node, job.time_limit_s, job.submit_time, job.priority, int(job.phase), int(job.result),
            int(job.reason), job.reason_detail, int(job.hold), _allocation_text(job), job.start_time,
            job.end_time, job.exit_code, job.exit_signal, job.restart_count, int(job.last_stop_reason),
            job.array_job_id, job.array_task_id, job.figures)


def _allocation_from_text(text: str) -> tuple[NodeAlloc, ...]:
    return tuple(NodeAlloc(n, tuple(g), c) for n, g, c in json.loads(text))


def _allocation_text(job: Job) -> str:
    return json.dumps([[a.node, list(a.gpus), a.cpus] for a in job.allocation]) if job.allocation else "[]"


def _job_from_row(row) -> Job:
    values = dict(zip(("job_id",) + _JOB_COLUMNS, row))
    values["phase"] = JobPhase(values["phase"])
    values["result"] = JobResult(values["result"])
    values["reason"] = Reason(values["reason"])
    values["last_stop_reason"] = Reason(values["last_stop_reason"])
    values["hold"] = bool(values["hold"])
    values["allocation"] = _allocation_from_text(values["allocation"])
    values["request"] = pb.JobRequest.FromString(values["request"])
    return Job(**values)
