"""The scheduler: one pure pass over a snapshot; no I/O, no clock of its own.

A pass takes every pending job in priority order (then submit order, then id) and decides, for
each, start now or wait with a reason:

- Reasons decided before placement: held, dependency (given by the caller), partition down or
  not open to the job's account, QOS and account GPU limits, the array's %N throttle.
- Placement: a multi-node job starts on all its nodes at once or not at all. It goes under as
  few leaf switches as possible (one, when one switch has room), within `--switches` when asked.
  A single-node job takes the node with the fewest free GPUs that still fit (so whole nodes stay
  free for whole-node jobs), and on a node the GPUs are an aligned block, in one NVLink domain
  when the node reports them.
- Backfill: the first `reservations` jobs that cannot start get a reservation: the earliest
  time, from running jobs' time limits, at which enough nodes are free, and those nodes. A later
  job may start now only where it does not delay a reservation: on nodes no reservation holds,
  or ending before the reservation starts, or using only what the reservation leaves spare.
- Preemption: a job whose QOS may preempt others, and that would not otherwise start within the
  preemption grace time, picks victims among running jobs of those QOS: the fewest, lowest
  priority, most recently started jobs whose resources let it start.

Two kinds of "no": `infeasible` says a request can never run (refused at submit); `schedule`
leaves a job pending with the reason it waits.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from airctld.config import PartitionConfig, QosConfig
from airctld.model import Job, Node, NodeAlloc
from airctld.timefmt import format_limit
from protos.states import JobPhase, NodeState, Reason

INF = float("inf")


@dataclass
class FreeNode:
    name: str
    up: bool
    gpus: list[int]          # free GPU indices, ascending
    cpus: int                # free CPUs
    drained: bool = False
    switch: str = ""
    total_gpus: int = 0
    domains: dict[int, int] = field(default_factory=dict)   # GPU index -> NVLink domain


@dataclass(frozen=True)
class Reservation:
    job_id: int
    start: float
    end: float               # start plus the job's time limit (inf without one)
    nodes: tuple[str, ...]
    gpus_per_node: int
    cpus_per_node: int


@dataclass
class Plan:
    starts: list[tuple[int, tuple[NodeAlloc, ...]]] = field(default_factory=list)
    waiting: dict[int, Reason] = field(default_factory=dict)
    details: dict[int, str] = field(default_factory=dict)
    reservations: list[Reservation] = field(default_factory=list)
    preempt: dict[int, list[int]] = field(default_factory=dict)   # preemptor -> victims

    def estimate(self) -> dict[int, Reservation]:
        return {r.job_id: r for r in self.reservations}


@dataclass(frozen=True)
class Limits:
    """QOS and account limits, as the pass needs them."""
    qos: Mapping[str, QosConfig] = field(default_factory=dict)
    default_qos: str = "normal"
    account_chain: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # account -> it and those above
    account_max_gpus: Mapping[str, int] = field(default_factory=dict)


def free_resources(nodes: Iterable[Node], active: Iterable[Job],
                   switches: Mapping[str, str] | None = None) -> dict[str, FreeNode]:
    """What each node has free, given the jobs that hold resources (running or completing)."""
    switches = switches or {}
    free = {}
    for n in nodes:
        free[n.name] = FreeNode(n.name, n.state == NodeState.UP, sorted(n.gpu_indices), n.cpus,
                                n.state == NodeState.DRAIN, switches.get(n.name) or n.name, len(n.gpus),
                                {g.index: g.nvlink_domain for g in n.gpus})
    for job in active:
        for a in job.allocation:
            node = free.get(a.node)
            if node is not None:
                node.gpus = [g for g in node.gpus if g not in a.gpus]
                node.cpus -= a.cpus
    return free


def job_end(job: Job, now: float, completing_release_s: float) -> float:
    """When an active job's resources are expected back: its time limit, or soon if it is stopping."""
    if job.phase == JobPhase.COMPLETING:
        return now + completing_release_s
    if not job.time_limit_s:
        return INF
    return max(job.start_time + job.time_limit_s, now)


def pick_gpus(free: list[int], count: int, total: int, domains: Mapping[int, int]) -> tuple[int, ...]:
    """`count` of the free GPUs: an aligned block (0-1, 2-3, 0-3, ...) when one is free, so that the
    node keeps whole blocks for larger jobs; else within one NVLink domain; else the lowest."""
    if count == 0:
        return ()
    if count >= len(free):
        return tuple(free[:count])
    free_set = set(free)
    block = 1
    while block < count:
        block *= 2
    if block <= total:
        for start in range(0, total, block):
            members = range(start, min(start + block, total))
            if all(g in free_set for g in members) and len({domains.get(g, 0) for g in members}) == 1:
                return tuple(members[:count])
    by_domain: dict[int, list[int]] = {}
    for g in free:
        by_domain.setdefault(domains.get(g, 0), []).append(g)
    fitting = [d for d in by_domain.values() if len(d) >= count]
    if fitting:
        return tuple(min(fitting, key=len)[:count])
    return tuple(free[:count])


class _Pass:
    """The mutable state of one pass: free resources by node, bucketed by free GPU count per
    partition, reservations, and the limits' running totals."""

    def __init__(self, free: dict[str, FreeNode], partitions: Mapping[str, PartitionConfig],
                 active: Sequence[Job], now: float, completing_release_s: float, limits: Limits,
                 priority: Mapping[int, int]):
        self.free = free
        self.now = now
        self.limits = limits
        self.completing_release_s = completing_release_s
        self.active = active
        self.priority = priority
        self.part_nodes = {p: [n for n in part.nodes if n in free] for p, part in partitions.items()}
        self.max_gpus = {p: max((free[n].total_gpus for n in names), default=0) for p, names in self.part_nodes.items()}
        # buckets[p][k]: up nodes of partition p with exactly k free GPUs, in configuration order
        self.buckets: dict[str, list[dict[str, None]]] = {}
        self.node_parts: dict[str, list[str]] = {}
        self.up_count: dict[str, int] = {}
        self.drained_count: dict[str, int] = {}
        for p, names in self.part_nodes.items():
            b = [dict() for _ in range(self.max_gpus[p] + 1)]
            for n in names:
                node = free[n]
                self.node_parts.setdefault(n, []).append(p)
                if node.up:
                    b[len(node.gpus)][n] = None
            self.buckets[p] = b
            self.up_count[p] = sum(free[n].up for n in names)
            self.drained_count[p] = sum(free[n].drained for n in names)
        self.res_start: dict[str, float] = {}
        self.res_gpus: dict[str, int] = {}
        self.res_cpus: dict[str, int] = {}
        self.res_until: dict[str, float] = {}   # when the last reservation on the node ends
        self.spare_gpus: dict[str, int] = {}
        self.spare_cpus: dict[str, int] = {}
        self._releases: dict[str, list[tuple[float, int, int]]] | None = None
        self._avail_heaps: dict[tuple, list[tuple[float, str]]] = {}
        # limits' running totals
        self.used_qos_user: dict[tuple[str, str], int] = {}
        self.used_qos_account: dict[tuple[str, str], int] = {}
        self.used_account: dict[str, int] = {}
        self.array_running: dict[int, int] = {}
        self.any_limit = bool(limits.account_max_gpus) or any(
            q.max_gpus_per_user or q.max_gpus_per_account for q in limits.qos.values())
        for job in active:
            self.charge(job)

    # ---------------------------------------------------------------- limits

    def charge(self, job: Job) -> None:
        gpus = job.num_nodes * job.gpus_per_node
        qos = job.request.qos or self.limits.default_qos
        account = job.request.account or "default"
        key_u, key_a = (qos, job.user), (qos, account)
        self.used_qos_user[key_u] = self.used_qos_user.get(key_u, 0) + gpus
        self.used_qos_account[key_a] = self.used_qos_account.get(key_a, 0) + gpus
        for a in self.limits.account_chain.get(account, (account,)):
            self.used_account[a] = self.used_account.get(a, 0) + gpus
        if job.array_job_id:
            self.array_running[job.array_job_id] = self.array_running.get(job.array_job_id, 0) + 1

    def over_limit(self, job: Job) -> Reason | None:
        if not self.any_limit and not job.array_job_id:
            return None
        limits = self.limits
        gpus = job.num_nodes * job.gpus_per_node
        if job.array_job_id and job.request.array_max_running and \
                self.array_running.get(job.array_job_id, 0) >= job.request.array_max_running:
            return Reason.ARRAY_TASK_LIMIT
        if not gpus:
            return None
        qos_name = job.request.qos or limits.default_qos
        qos = limits.qos.get(qos_name)
        account = job.request.account or "default"
        if qos is not None:
            if qos.max_gpus_per_user and self.used_qos_user.get((qos_name, job.user), 0) + gpus > qos.max_gpus_per_user:
                return Reason.QOS_MAX_GPU_PER_USER
            if qos.max_gpus_per_account and \
                    self.used_qos_account.get((qos_name, account), 0) + gpus > qos.max_gpus_per_account:
                return Reason.QOS_MAX_GPU_PER_ACCOUNT
        for a in limits.account_chain.get(account, ()):
            cap = limits.account_max_gpus.get(a, 0)
            if cap and self.used_account.get(a, 0) + gpus > cap:
                return Reason.ASSOC_GRP_GPU_LIMIT
        return None

    # ---------------------------------------------------------------- placement

    def count_fitting(self, part: str, gpus: int) -> int:
        return sum(len(b) for b in self.buckets[part][gpus:])

    def usable(self, node: FreeNode, gpus: int, cpus: int, end: float, respect: bool) -> bool:
        if node.cpus < cpus:
            return False
        if not respect:
            return True
        start = self.res_start.get(node.name)
        if start is None or end <= start:
            return True
        return self.spare_gpus[node.name] >= gpus and self.spare_cpus[node.name] >= cpus

    def place(self, job: Job, part: str, end: float, respect: bool = True) -> tuple[NodeAlloc, ...] | None:
        """Nodes and GPUs for the job now, or None; `respect`: leave reservations whole."""
        n, g, c = job.num_nodes, job.gpus_per_node, job.cpus_per_node
        buckets = self.buckets[part]
        free = self.free
        chosen: list[FreeNode] = []
        if n == 1:
            for k in range(g, len(buckets)):     # best fit: the fewest free GPUs that suffice
                for name in buckets[k]:
                    node = free[name]
                    if self.usable(node, g, c, end, respect):
                        chosen = [node]
                        break
                if chosen:
                    break
        else:
            by_switch: dict[str, list[FreeNode]] = {}
            whole = None
            for k in range(g, len(buckets)):
                for name in buckets[k]:
                    node = free[name]
                    if not self.usable(node, g, c, end, respect):
                        continue
                    group = by_switch.setdefault(node.switch, [])
                    group.append(node)
                    if len(group) >= n:
                        whole = group
                        break
                if whole:
                    break
            if whole:
                chosen = whole[:n]
            else:
                if sum(len(v) for v in by_switch.values()) < n:
                    return None
                groups = sorted(by_switch.items(), key=lambda kv: (-len(kv[1]), kv[0]))
                wanted = job.request.switches
                if wanted and not _fits_in(groups, n, wanted) and \
                        self.now - job.submit_time < job.request.switches_wait_s:
                    return None
                for _, group in groups:
                    chosen.extend(group[:n - len(chosen)])
                    if len(chosen) == n:
                        break
        if len(chosen) < n:
            return None
        return tuple(NodeAlloc(node.name, pick_gpus(node.gpus, g, node.total_gpus, node.domains), c)
                     for node in chosen)

    def take(self, job: Job, alloc: tuple[NodeAlloc, ...], end: float) -> None:
        for a in alloc:
            node = self.free[a.node]
            before = len(node.gpus)
            taken = set(a.gpus)
            node.gpus = [x for x in node.gpus if x not in taken]
            node.cpus -= a.cpus
            for p in self.node_parts.get(a.node, ()):
                b = self.buckets[p]
                del b[before][a.node]
                b[len(node.gpus)][a.node] = None
            start = self.res_start.get(a.node)
            if start is not None and end > start:
                self.spare_gpus[a.node] -= len(a.gpus)
                self.spare_cpus[a.node] -= a.cpus
            if self._releases is not None:
                self._releases.setdefault(a.node, []).append((end, len(a.gpus), a.cpus))
                self._releases[a.node].sort()
        self.charge(job)

    # ---------------------------------------------------------------- reservations

    def releases(self) -> dict[str, list[tuple[float, int, int]]]:
        if self._releases is None:
            rel: dict[str, list[tuple[float, int, int]]] = {}
            for job in self.active:
                end = job_end(job, self.now, self.completing_release_s)
                for a in job.allocation:
                    rel.setdefault(a.node, []).append((end, len(a.gpus), a.cpus))
            for v in rel.values():
                v.sort()
            self._releases = rel
        return self._releases

    def free_at(self, name: str, when: float) -> tuple[int, int]:
        node = self.free[name]
        g, c = len(node.gpus), node.cpus
        for t, rg, rc in self.releases().get(name, ()):
            if t > when:
                break
            g += rg
            c += rc
        return g, c

    def available_from(self, name: str, gpus: int, cpus: int) -> float:
        """The earliest time the node has `gpus` and `cpus` for another reservation: beside the
        reservations it has (their resources counted as held from then on), or after they end."""
        node = self.free[name]
        held_g, held_c = self.res_gpus.get(name, 0), self.res_cpus.get(name, 0)
        until = self.res_until.get(name, self.now)
        g, c = len(node.gpus), node.cpus
        beside = after = INF
        if g >= gpus + held_g and c >= cpus + held_c:
            return self.now
        if g >= gpus and c >= cpus:
            after = until
        for t, rg, rc in self.releases().get(name, ()):
            g += rg
            c += rc
            if beside == INF and g >= gpus + held_g and c >= cpus + held_c:
                beside = t
                break
            if after == INF and g >= gpus and c >= cpus:
                after = max(t, until)
        return min(beside, after)

    def reserve(self, job: Job, part: str) -> Reservation | None:
        n, g, c = job.num_nodes, job.gpus_per_node, job.cpus_per_node
        key = (part, g, c)
        base = self._avail_heaps.get(key)
        if base is None:
            base = [(self.available_from(name, g, c), name) for name in self.part_nodes[part]
                    if self.free[name].up]
            heapq.heapify(base)
            self._avail_heaps[key] = base
        heap = list(base)
        chosen: list[tuple[float, str]] = []
        while heap and len(chosen) < n:
            t, name = heapq.heappop(heap)
            if t == INF:
                break
            exact = self.available_from(name, g, c)
            if exact == t:
                chosen.append((t, name))
            elif exact < INF:
                heapq.heappush(heap, (exact, name))
        if len(chosen) < n:
            return None
        start = max(t for t, _ in chosen)
        end = start + job.time_limit_s if job.time_limit_s else INF
        names = tuple(name for _, name in chosen)
        for name in names:
            self.res_gpus[name] = self.res_gpus.get(name, 0) + g
            self.res_cpus[name] = self.res_cpus.get(name, 0) + c
            self.res_start[name] = min(self.res_start.get(name, INF), start)
            self.res_until[name] = max(self.res_until.get(name, self.now), end)
            # what backfill may use past the first reservation: free then, less all that is reserved
            fg, fc = self.free_at(name, self.res_start[name])
            self.spare_gpus[name] = fg - self.res_gpus[name]
            self.spare_cpus[name] = fc - self.res_cpus[name]
        return Reservation(job.job_id, start, end, names, g, c)

    # ---------------------------------------------------------------- preemption

    def victims(self, job: Job, part: str, candidates: list[Job], taken: set[int]) -> list[int]:
        """The fewest, lowest-priority, most recently started running jobs whose resources let `job`
        start now; [] when none do."""
        n, g, c = job.num_nodes, job.gpus_per_node, job.cpus_per_node
        names = set(self.part_nodes[part])
        hyp = {name: [len(self.free[name].gpus), self.free[name].cpus] for name in names if self.free[name].up}
        mine = [v for v in candidates if v.job_id not in taken and any(a.node in hyp for a in v.allocation)]
        mine.sort(key=lambda v: (self.priority.get(v.job_id, v.priority), -v.start_time, -v.job_id))

        def fits() -> bool:
            return sum(1 for fg, fc in hyp.values() if fg >= g and fc >= c) >= n

        def add(v: Job, sign: int) -> None:
            for a in v.allocation:
                if a.node in hyp:
                    hyp[a.node][0] += sign * len(a.gpus)
                    hyp[a.node][1] += sign * a.cpus

        chosen = []
        for v in mine:
            add(v, 1)
            chosen.append(v)
            if fits():
                break
        else:
            return []
        for v in reversed(chosen[:-1]):   # drop any the others make unnecessary, keeping the cheapest set
            add(v, -1)
            if fits():
                chosen.remove(v)
            else:
                add(v, 1)
        return [v.job_id for v in chosen]


def _fits_in(groups, n: int, switches: int) -> bool:
    return sum(len(g) for _, g in groups[:switches]) >= n


def _held_back(job: Job, blocked: Mapping[int, Reason], partitions: Mapping[str, PartitionConfig],
               state: _Pass) -> Reason | None:
    """Why the job waits whatever the resources: held, a dependency, its partition, a limit."""
    if job.hold:
        return Reason.JOB_HELD_USER
    reason = blocked.get(job.job_id)
    if reason is not None:
        return reason
    part = partitions.get(job.partition)
    if part is None or not part.up:
        return Reason.PARTITION_DOWN
    if part.accounts and (job.request.account or "default") not in part.accounts:
        return Reason.ACCOUNT_NOT_ALLOWED
    return state.over_limit(job)


def schedule(pending: Iterable[Job], free: dict[str, FreeNode], partitions: Mapping[str, PartitionConfig], *,
             now: float = 0.0, active: Sequence[Job] = (), priority: Mapping[int, int] | None = None,
             blocked: Mapping[int, Reason] | None = None, limits: Limits | None = None,
             reservations: int = 100, completing_release_s: float = 30.0,
             preempt_grace_s: float = 30.0, backfill: bool = True) -> Plan:
    """Decide which pending jobs start now and why the others wait. `free` is updated in place.

    `priority` maps job ids to their priority (default: the job's own field); `blocked` gives jobs
    that wait for a reason decided outside the pass (dependencies); `active` are the running and
    completing jobs, whose time limits place reservations and whose QOS may make them victims.
    With `backfill` off, the first job that cannot start in a partition holds back every job
    after it there (strict priority order; for comparison in bench/)."""
    priority = priority or {}
    blocked = blocked or {}
    limits = limits or Limits()
    plan = Plan()
    state = _Pass(free, partitions, active, now, completing_release_s, limits, priority)
    victims_taken: set[int] = set()
    preemptable = None
    no_cache: dict[tuple, tuple[int, Reason]] = {}   # a shape that could not start, until resources change
    generation = 0
    waiting = plan.waiting
    pri_get = priority.get
    stalled: set[str] = set()   # partitions held back by a waiting job, when backfill is off
    for job in sorted(pending, key=lambda j: (-pri_get(j.job_id, j.priority), j.submit_time, j.job_id)):
        job_id = job.job_id
        reason = _held_back(job, blocked, partitions, state)
        if reason is not None:
            waiting[job_id] = reason
            continue
        req = job.request
        qos = limits.qos.get(req.qos or limits.default_qos)
        preemptor = qos is not None and bool(qos.preempt)
        shape = (job.partition, job.num_nodes, job.gpus_per_node, job.cpus_per_node, job.time_limit_s,
                 req.switches, job.submit_time if req.switches else 0)
        cached = no_cache.get(shape)
        if cached is not None and cached[0] == generation and not preemptor:
            waiting[job_id] = cached[1]
            continue
        name = job.partition
        if name in stalled:
            waiting[job_id] = Reason.PRIORITY
            continue
        end = now + job.time_limit_s if job.time_limit_s else INF
        if state.up_count[name] < job.num_nodes:
            reason = Reason.NODES_DRAINED if state.up_count[name] + state.drained_count[name] >= job.num_nodes \
                else Reason.NODES_DOWN
            waiting[job_id] = reason
            no_cache[shape] = (generation, reason)
            continue
        alloc = None
        if state.count_fitting(name, job.gpus_per_node) >= job.num_nodes:
            alloc = state.place(job, name, end)
        if alloc is not None:
            state.take(job, alloc, end)
            plan.starts.append((job_id, alloc))
            generation += 1
            continue
        reason = Reason.RESOURCES
        if not backfill:
            stalled.add(name)
        if state.res_start and state.count_fitting(name, job.gpus_per_node) >= job.num_nodes \
                and state.place(job, name, end, respect=False) is not None:
            reason = Reason.PRIORITY
        waiting[job_id] = reason
        res = None
        if len(plan.reservations) < reservations or preemptor:
            res = state.reserve(job, name)
            if res is not None:
                plan.reservations.append(res)
        if preemptor and (res is None or res.start > now + preempt_grace_s):
            if preemptable is None:
                preemptable = [j for j in active if j.phase == JobPhase.RUNNING]
            allowed = set(qos.preempt)
            candidates = [v for v in preemptable if (v.request.qos or limits.default_qos) in allowed]
            chosen = state.victims(job, name, candidates, victims_taken)
            if chosen:
                plan.preempt[job_id] = chosen
                victims_taken.update(chosen)
            continue
        no_cache[shape] = (generation, reason)
    return plan


def infeasible(num_nodes: int, gpus_per_node: int, cpus_per_node: int, time_limit_s: int,
               part: PartitionConfig, capacity: Mapping[str, tuple[int, int]]) -> str | None:
    """Why a request could never run in the partition, or None. `capacity` maps node -> (gpus, cpus);
    nodes whose hardware is not known yet are left out and never count against a request."""
    if num_nodes > len(part.nodes):
        return f"{num_nodes} nodes requested, but partition {part.name} has only {len(part.nodes)}"
    if part.max_time_s and time_limit_s > part.max_time_s:
        return (f"time limit {format_limit(time_limit_s)} is over partition {part.name}'s "
                f"maximum of {format_limit(part.max_time_s)}")
    known = [capacity[n] for n in part.nodes if n in capacity]
    if len(known) < len(part.nodes):
        return None
    big_enough = [n for n in known if n[0] >= gpus_per_node and n[1] >= cpus_per_node]
    if len(big_enough) >= num_nodes:
        return None
    most_gpus = max(g for g, _ in known)
    if gpus_per_node > most_gpus:
        return (f"{gpus_per_node} GPUs per node requested, but no node in partition {part.name} "
                f"has more than {most_gpus}; ask for fewer per node and more nodes (--nodes)")
    most_cpus = max(c for _, c in known)
    if cpus_per_node > most_cpus:
        return (f"{cpus_per_node} CPUs per node requested, but no node in partition {part.name} "
                f"has more than {most_cpus}")
    return (f"{num_nodes} nodes with {gpus_per_node} GPUs and {cpus_per_node} CPUs each requested, "
            f"but partition {part.name} has only {len(big_enough)} such nodes")
