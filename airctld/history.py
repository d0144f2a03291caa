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

from airctld.model import Job
from protos import air_pb2 as pb
from protos.states import JobPhase, JobResult

CHUNK = 500   # ids per IN (...) list: well under SQLite's limit on variables
_CANCELLED = "CANCELLED"


def query(conn: sqlite3.Connection, req: pb.HistoryRequest, columns: str, from_row, limit: int) -> tuple[list[Job], bool]:
    """Jobs matching `req` in job id order, at most `limit` of them, and whether more matched.
    `columns` and `from_row` are the store's: how a job row is selected and read."""
    where, params = _conditions(req)
    ended = ["phase = 4"] + where
    if req.since:
        ended.append("end_time >= ?")
    active = ["phase != 4"] + where
    sql = (f"SELECT id, {columns} FROM jobs WHERE {' AND '.join(ended)} "
           f"UNION ALL SELECT id, {columns} FROM jobs WHERE {' AND '.join(active)} ORDER BY id LIMIT ?")
    rows = conn.execute(sql, params + ([req.since] if req.since else []) + params + [limit + 1]).fetchall()
    return [from_row(r) for r in rows[:limit]], len(rows) > limit


def _conditions(req: pb.HistoryRequest) -> tuple[list[str], list]:
    where: list[str] = []
    params: list = []

    def among(column: str, values: Iterable) -> None:
        values = list(dict.fromkeys(values))
        if values:
            where.append(f"{column} IN ({', '.join('?' * len(values))})")
            params.extend(values)

    if req.job_ids or req.array_tasks:
        ids = list(dict.fromkeys(req.job_ids))
        parts = []
        if ids:
            marks = ", ".join("?" * len(ids))
            parts.append(f"id IN ({marks}) OR array_job_id IN ({marks})")
            params.extend(ids + ids)
        for t in req.array_tasks:
            parts.append("(array_job_id = ? AND array_task_id = ?)")
            params.extend([t.array_job_id, t.task_id])
        where.append("(" + " OR ".join(parts) + ")")
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


def details(conn: sqlite3.Connection, job_ids: list[int]) -> tuple[dict, dict, dict]:
    """For these jobs: their earlier runs, their steps, and who cancelled each cancelled one."""
    runs: dict[int, list[pb.HistoryRun]] = {}
    steps: dict[int, list[pb.HistoryStep]] = {}
    cancelled: dict[int, int] = {}
    for i in range(0, len(job_ids), CHUNK):
        chunk = job_ids[i:i + CHUNK]
        marks = ", ".join("?" * len(chunk))
        for job_id, run, start, end, allocation, reason, detail, code, sig in conn.execute(
                "SELECT job_id, run, start_time, end_time, allocation, reason, detail, exit_code, exit_signal FROM runs "
                f"WHERE job_id IN ({marks}) ORDER BY job_id, run", chunk):
            runs.setdefault(job_id, []).append(pb.HistoryRun(
                run=run, start_time=start, end_time=end, reason=reason, detail=detail, exit_code=code,
                exit_signal=sig,
                allocation=[pb.NodeAlloc(node=n, gpus=g, cpus=c) for n, g, c in json.loads(allocation)]))
        for job_id, step_id, run, created, nodes, ntasks, command in conn.execute(
                "SELECT job_id, step_id, run, created, nodes, ntasks, command FROM steps "
                f"WHERE job_id IN ({marks}) ORDER BY job_id, step_id", chunk):
            steps.setdefault(job_id, []).append(pb.HistoryStep(
                step_id=step_id, run=run, start_time=created, nodes=nodes, ntasks=ntasks, command=command))
        for job_id, who in conn.execute(   # the first such event is the request; later ones, its end
                f"SELECT job_id, who FROM events WHERE job_id IN ({marks}) AND reason = ? ORDER BY id",
                chunk + [_CANCELLED]):
            cancelled.setdefault(job_id, who)
    return runs, steps, cancelled
