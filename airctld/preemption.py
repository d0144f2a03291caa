"""Preemption, as the scheduler's pass uses it: who may preempt whom (rank), which running jobs a
preemptor takes (victims) and on which nodes it will start, and the holds on those nodes, placed
ahead of every other job at the start of each pass until the preemptor starts."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from air.airctld.model import Job

if TYPE_CHECKING:
    from air.airctld.scheduler import Limits, Plan, Reservation, _Pass

INF = float("inf")


def victims(state: _Pass, job: Job, part: str, candidates: list[Job], taken: set[int], start: float
            ) -> tuple[list[int], tuple[str, ...]]:
    """The fewest, lowest-priority, most recently started running jobs whose resources let `job`
    start (at `start`, once they are gone), and the nodes it would start on (the victims' and free
    ones): all of them are to be held for it. ([], ()) when no set of victims lets it start.

    A node counts only if the job would delay no reservation on it: it ends before every
    reservation there of a job it does not outrank (by priority), made earlier in the pass."""
    n, g, c = job.num_nodes, job.gpus_per_node, job.cpus_per_node
    end = start + job.time_limit_s if job.time_limit_s else INF
    mine_pri = state.priority.get(job.job_id, job.priority)

    def clear(name: str) -> bool:
        return all(r[4] == job.job_id or r[0] >= end or state.res_pri.get(r[4], 0) < mine_pri
                   for r in state.res_list.get(name, ()))
    filt = state.filter_of(job)   # -w, -x, -C, --exclusive: only the nodes it may use count
    names = set(state.eligible(job, part).names) if filt.restricts else set(state.part_nodes[part])
    listed = set(filt.required)
    hyp = {name: [len(state.free[name].gpus), state.free[name].cpus] for name in names
           if state.free[name].up and clear(name)}
    mine = [v for v in candidates if v.job_id not in taken and any(a.node in hyp for a in v.allocation)]
    mine.sort(key=lambda v: (state.priority.get(v.job_id, v.priority), -v.start_time, -v.job_id))

    def fitting() -> list[str]:
        if not filt.restricts:
            return [name for name, (fg, fc) in hyp.items() if fg >= g and fc >= c]
        return [name for name, (fg, fc) in hyp.items()
                if (room := state.need(job, state.free[name])) and fg >= room[0] and fc >= room[1]]

    def enough() -> bool:
        fit = fitting()
        return len(fit) >= n and listed.issubset(fit)

    def add(v: Job, sign: int) -> None:
        for a in v.allocation:
            if a.node in hyp:
                hyp[a.node][0] += sign * len(a.gpus)
                hyp[a.node][1] += sign * a.cpus

    chosen = []
    for v in mine:
        add(v, 1)
        chosen.append(v)
        if enough():
            break
    else:
        return [], ()
    for v in reversed(chosen[:-1]):   # drop any the others make unnecessary, keeping the cheapest set
        add(v, -1)
        if enough():
            chosen.remove(v)
        else:
            add(v, 1)
    # the victims' nodes first, then the free ones that make up the count
    freed = {a.node for v in chosen for a in v.allocation}
    nodes = sorted(fitting(), key=lambda name: (name not in listed, name not in freed, name))[:n]
    return [v.job_id for v in chosen], tuple(sorted(nodes))


def rank(job: Job, limits: Limits, priority: Mapping[int, int]) -> tuple[int, int]:
    """How a job ranks for preemption: its priority, then its QOS's priority."""
    qos = limits.qos.get(limits.qos_name(job))
    return priority.get(job.job_id, job.priority), qos.priority if qos is not None else 0


def may_preempt(job: Job, victim: Job, limits: Limits, priority: Mapping[int, int]) -> bool:
    """Whether `job` may preempt `victim`: its QOS names the victim's, and it outranks the victim."""
    qos = limits.qos.get(limits.qos_name(job))
    if qos is None or limits.qos_name(victim) not in qos.preempt:
        return False
    return rank(job, limits, priority) > rank(victim, limits, priority)


def place_holds(order: list[Job], holds: Mapping[int, Iterable[str]], held_back: Callable[[Job], bool],
                state: _Pass, plan: Plan, not_before: Mapping[int, float]) -> dict[int, Reservation]:
    """Reservations, made before any job is looked at, for each pending preemptor on the nodes held
    for it (its victims' and the free ones it counted): no other job, of any priority, takes them
    before it starts. When too few of them are left, it is reserved the earliest nodes elsewhere,
    still ahead of every other job. A preemptor that cannot start now whatever the nodes
    (`held_back`: held, waiting for a dependency, its partition down or closed to its account, over
    a limit) holds nothing this pass: nodes are never kept idle for a job that could not use them."""
    out = {}
    for job in (order if holds else ()):
        nodes = holds.get(job.job_id)
        if nodes is None or held_back(job):
            continue
        later = not_before.get(job.job_id, 0.0)   # (requeued: not before its fence)
        res = state.reserve(job, job.partition, only=nodes, not_before=later)
        if res is None:   # too few of its nodes are left: the earliest anywhere, still ahead of the queue
            res = state.reserve(job, job.partition, not_before=later)
        if res is not None:
            out[job.job_id] = res
            plan.reservations.append(res)
    return out
