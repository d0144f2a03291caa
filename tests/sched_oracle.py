"""A reference for tests, tiny instances only (up to ~6 nodes, ~8 jobs). It is not a brute force
over start orders: it states the intended rule (each job, in priority order, takes its earliest
slot given the jobs above it) directly, slowly and with plain lists, and shares no code with the
scheduler (it imports nothing from airctld; the test computes the running jobs' ends itself). It
therefore checks the scheduler's data structures (buckets, cached steps, spare, heaps) against the
rule, not the rule itself: a mistake in the rule made in both would pass.

What it assumes, so that it stays obviously right:
- One partition; every node given is up. A node is its GPU and CPU counts: which GPU indices a
  job gets, switches and NVLink domains do not matter here.
- Every job, running or reserved, holds its resources from its start until its start plus its
  time limit; a job without a time limit holds them forever. Time is continuous.
- No holds, dependencies, limits, arrays or preemption: every pending job is eligible.
- Priority order is the list order given (the caller sorts by priority, submit time, id).

Its answers:
- `expected_starts`: each job, in priority order, takes the earliest time at which its node count
  of nodes have room for it over its whole time limit, given the running jobs and the slots of
  the jobs above it (every end time and every node tried). Of the nodes with room then, it takes
  those that had room the shortest time before (then by name): nodes free sooner stay for the
  jobs below, as the real scheduler's reservations leave them.
- `delays`: given the jobs a scheduler started now, the higher-priority waiting jobs whose expected
  start got later because of a lower-priority start.
- `accepts`: a set of starts is acceptable when it delays nobody and it leaves waiting no job that
  the strict priority order would start now.
"""
from __future__ import annotations

from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True)
class OJob:
    job_id: int
    nodes: int
    gpus: int
    cpus: int
    limit: float            # 0: no limit


@dataclass(frozen=True)
class Use:                  # resources held on one node over [start, end)
    node: str
    gpus: int
    cpus: int
    start: float
    end: float


def _room_from(cap: dict[str, tuple[int, int]], uses: list[Use], node: str, job: OJob, t: float) -> bool:
    """Whether the node has room for the job at every moment from t on."""
    mine = [u for u in uses if u.node == node and u.end > t]
    # the use on a node only grows where a use starts, so t and each later start are the moments to check
    for moment in [t] + [u.start for u in mine if u.start > t]:
        g = sum(u.gpus for u in mine if u.start <= moment < u.end)
        c = sum(u.cpus for u in mine if u.start <= moment < u.end)
        if cap[node][0] - g < job.gpus or cap[node][1] - c < job.cpus:
            return False
    return True


def earliest(cap: dict[str, tuple[int, int]], uses: list[Use], job: OJob, now: float):
    """(time, nodes) of the job's slot, or (INF, ()): each node is ready from the first time (now, or
    when something ends) from which it keeps room for the job; the job starts when its node count
    of nodes are ready, on those ready last (then by name)."""
    times = sorted({now} | {u.end for u in uses if now < u.end < INF})
    ready = {}
    for n in sorted(cap):
        ready[n] = next((t for t in times if _room_from(cap, uses, n, job, t)), INF)
    by_time = sorted(ready.values())
    if len(by_time) < job.nodes or by_time[job.nodes - 1] == INF:
        return INF, ()
    start = by_time[job.nodes - 1]
    chosen = sorted((n for n in cap if ready[n] <= start), key=lambda n: (-ready[n], n))[:job.nodes]
    return start, tuple(sorted(chosen))


def _use(job: OJob, nodes, t: float) -> list[Use]:
    return [Use(n, job.gpus, job.cpus, t, t + job.limit if job.limit else INF) for n in nodes]


def slots(cap, running: list[Use], order: list[OJob], starts: dict[int, tuple[str, ...]],
          now: float) -> dict[int, tuple[float, tuple[str, ...]]]:
    """Walk the queue in priority order: a started job holds its nodes from now, every other job takes
    its earliest slot given all above it. Returns each waiting job's (expected start, nodes)."""
    uses = list(running)
    out = {}
    for job in order:
        if job.job_id in starts:
            uses += _use(job, starts[job.job_id], now)
            continue
        out[job.job_id] = t, nodes = earliest(cap, uses, job, now)
        uses += _use(job, nodes, t)
    return out


def delays(cap, running: list[Use], order: list[OJob], starts: dict[int, tuple[str, ...]],
           now: float) -> list[tuple[int, float, float]]:
    """(job, expected start, start once the jobs started below it count too) for each waiting job
    that a lower-priority start pushes later."""
    expected = slots(cap, running, order, starts, now)
    started = [u for j in order if j.job_id in starts for u in _use(j, starts[j.job_id], now)]
    out = []
    for k, job in enumerate(order):
        if job.job_id in starts:
            continue
        above = [u for j in order[:k] if j.job_id in expected for u in _use(j, expected[j.job_id][1],
                                                                           expected[j.job_id][0])]
        after = earliest(cap, running + started + above, job, now)[0]
        if after > expected[job.job_id][0]:
            out.append((job.job_id, expected[job.job_id][0], after))
    return out


def left_idle(cap, running: list[Use], order: list[OJob], starts: dict[int, tuple[str, ...]],
              now: float) -> list[int]:
    """The first waiting job, when strict priority order would start it now."""
    uses = list(running) + [u for j in order if j.job_id in starts for u in _use(j, starts[j.job_id], now)]
    for job in order:
        if job.job_id not in starts:
            return [job.job_id] if earliest(cap, uses, job, now)[0] == now else []
    return []


def accepts(cap, running, order, starts, now) -> bool:
    return not delays(cap, running, order, starts, now) and not left_idle(cap, running, order, starts, now)
