"""Job history (airacct): the jobs of the store that match a request, with each earlier run of a
requeued job and each step, read on a connection of its own so that a long read never holds up the
controller. The store is the whole truth: a change reaches memory only once it has been committed.

The queries are shaped for the store's indexes: jobs that ended after a time, by user
(jobs_uid_end), by account (jobs_account_end) or of anyone (jobs_end), and jobs not ended
(jobs_active); see bench/bench_history.py for their cost over a million jobs."""
from __future__ import annotations

import json
import sqlite3
from typing import Iterable

from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, JobResult

CHUNK = 500             # ids per IN (...) list: well under SQLite's limit on variables
MAX_NAMED = 10_000      # job ids and array tasks one request may name
MAX_MATCHED = 30_000    # jobs those may stand for, whole arrays counted
MAX_VALUES = 1_000      # users, accounts, partitions, QOS, names or states in one request
MAX_STEPS = 1_000       # steps shown of one job: its last ones (a job may have 40,000)
_CANCELLED = "CANCELLED"


class TooMuch(ValueError):
    """A request larger than history answers; the message names the limit."""


def check(req: pb.HistoryRequest) -> None:
    named = len(req.job_ids) + len(req.array_tasks)
    if named > MAX_NAMED:
        raise TooMuch(f"{named} jobs named; the limit is {MAX_NAMED}")
    for field in ("uids", "accounts", "partitions", "qos", "names", "phases", "results"):
        if len(getattr(req, field)) > MAX_VALUES:
            raise TooMuch(f"{len(getattr(req, field))} {field} given; the limit is {MAX_VALUES}")


def matching_ids(conn: sqlite3.Connection, req: pb.HistoryRequest, limit: int) -> tuple[list[int], bool]:
    """The ids of the jobs matching `req`, in order, at most `limit` of them, and whether more matched.
    Rows are read whole only afterwards, a few at a time (see Store.history): a job's request may
    hold megabytes of script.

    Jobs named by id are looked up by id. Otherwise ended jobs come from the index that narrows
    most (a user's, an account's, or all jobs by end time), jobs not ended from jobs_active, and
    with neither (the whole history) a walk in id order that stops at the page's end."""
    check(req)
    where, params = _conditions(req)
    if req.job_ids or req.array_tasks:
        named = _named(conn, req)
        ids = []
        for i in range(0, len(named), CHUNK):
            chunk = named[i:i + CHUNK]
            ids += [r for (r,) in conn.execute(
                f"SELECT id FROM jobs WHERE id IN ({', '.join('?' * len(chunk))})"
                + "".join(f" AND {w}" for w in where) + (" AND (phase != 4 OR end_time >= ?)" if req.since else ""),
                chunk + params + ([req.since] if req.since else []))]
        ids.sort()
    else:
        ended = ["phase = 4"] + where
        hint = ""
        if req.since:
            ended.append("end_time >= ?")
            hint = "INDEXED BY jobs_uid_end" if req.uids else "INDEXED BY jobs_account_end" if req.accounts \
                else "INDEXED BY jobs_end"
        sql = (f"SELECT id FROM jobs {hint} WHERE {' AND '.join(ended)} "
               "UNION ALL SELECT id FROM jobs INDEXED BY jobs_active WHERE phase != 4"
               + "".join(f" AND {w}" for w in where) + " ORDER BY id LIMIT ?")
        ids = [r for (r,) in conn.execute(sql, params + ([req.since] if req.since else []) + params + [limit + 1])]
    return ids[:limit], len(ids) > limit


ROWS_AT_ONCE = 32   # jobs read whole at once: a request may hold megabytes of script, a job 1,000 steps


def rows(conn: sqlite3.Connection, ids: list[int], columns: str):
    """The rows of these jobs, in order."""
    return conn.execute(f"SELECT id, {columns} FROM jobs WHERE id IN ({', '.join('?' * len(ids))}) ORDER BY id",
                        ids)


def _named(conn: sqlite3.Connection, req: pb.HistoryRequest) -> list[int]:
    """The ids of the jobs a request names: each job id, every task of an array named by its id, and
    single array tasks. Bounded by MAX_MATCHED."""
    found = set()
    ids = list(dict.fromkeys(req.job_ids))
    for i in range(0, len(ids), CHUNK):
        chunk = ids[i:i + CHUNK]
        marks = ", ".join("?" * len(chunk))
        found.update(r for (r,) in conn.execute(f"SELECT id FROM jobs WHERE id IN ({marks})", chunk))
        found.update(r for (r,) in conn.execute(
            f"SELECT id FROM jobs INDEXED BY jobs_array WHERE array_job_id != 0 AND array_job_id IN ({marks})",
            chunk))
        if len(found) > MAX_MATCHED:
            break
    for t in req.array_tasks:
        found.update(r for (r,) in conn.execute(
            "SELECT id FROM jobs INDEXED BY jobs_array WHERE array_job_id != 0 AND array_job_id = ? "
            "AND array_task_id = ?", [t.array_job_id, t.task_id]))
    if len(found) > MAX_MATCHED:
        raise TooMuch(f"the jobs named stand for over {MAX_MATCHED} jobs; name fewer")
    return sorted(found)


def _conditions(req: pb.HistoryRequest) -> tuple[list[str], list]:
    """Every filter but the jobs named and the time since (those shape the query itself)."""
    where: list[str] = []
    params: list = []

    def among(column: str, values: Iterable) -> None:
        values = list(dict.fromkeys(values))
        if values:
            where.append(f"{column} IN ({', '.join('?' * len(values))})")
            params.extend(values)

    among("uid", req.uids)
    among("account", req.accounts)
    among("partition", req.partitions)
    among("qos", req.qos)
    among("name", req.names)
    states = []
    if req.phases or req.results:
        for phase in req.phases:
            if phase != JobPhase.DONE or not req.results:   # DONE with results: those results only
                states.append(("phase = ?", [int(phase)]))
        for result in req.results:
            states.append(("(phase = 4 AND result = ?)", [int(result)]))
            if result == JobResult.COMPLETED:   # a job that ended before results were kept
                states.append(("(phase = 4 AND result = 0)", []))
        where.append("(" + " OR ".join(s for s, _ in states) + ")" if states else "0")
        for _, p in states:
            params.extend(p)
    if req.until:
        where.append("submit_time <= ?")
        params.append(req.until)
    if req.after_job_id:
        where.append("id > ?")
        params.append(req.after_job_id)
    return where, params


def details(conn: sqlite3.Connection, job_ids: list[int], with_steps: bool = True) -> tuple[dict, dict, dict]:
    """For these jobs: their earlier runs, their last MAX_STEPS steps, and who cancelled each
    cancelled one."""
    runs: dict[int, list[pb.HistoryRun]] = {}
    steps: dict[int, list[pb.HistoryStep]] = {}
    cancelled: dict[int, int] = {}
    for i in range(0, len(job_ids), CHUNK):
        chunk = job_ids[i:i + CHUNK]
        marks = ", ".join("?" * len(chunk))
        for job_id, run, start, end, allocation, reason, detail, code, sig, figures in conn.execute(
                "SELECT job_id, run, start_time, end_time, allocation, reason, detail, exit_code, exit_signal, figures "
                f"FROM runs WHERE job_id IN ({marks}) ORDER BY job_id, run", chunk):
            runs.setdefault(job_id, []).append(pb.HistoryRun(
                run=run, start_time=start, end_time=end, reason=reason, detail=detail, exit_code=code,
                exit_signal=sig, figures=figures,
                allocation=[pb.NodeAlloc(node=n, gpus=g, cpus=c) for n, g, c in json.loads(allocation)]))
        for job_id, step_id, run, created, nodes, ntasks, command, ended, code, sig, stopped in conn.execute(
                "SELECT job_id, step_id, run, created, nodes, ntasks, command, end_time, exit_code, exit_signal, "
                "cancelled FROM "
                "(SELECT *, ROW_NUMBER() OVER (PARTITION BY job_id ORDER BY step_id DESC) AS nth FROM steps "
                f"WHERE job_id IN ({marks})) WHERE nth <= ? ORDER BY job_id, step_id",
                chunk + [MAX_STEPS]) if with_steps else ():
            steps.setdefault(job_id, []).append(pb.HistoryStep(
                step_id=step_id, run=run, start_time=created, nodes=nodes, ntasks=ntasks, command=command,
                end_time=ended, exit_code=code, exit_signal=sig, cancelled=bool(stopped)))
        for job_id, who in conn.execute(   # the first such event is the request; later ones, its end
                f"SELECT job_id, who FROM events WHERE job_id IN ({marks}) AND reason = ? ORDER BY id",
                chunk + [_CANCELLED]):
            cancelled.setdefault(job_id, who)
    return runs, steps, cancelled
