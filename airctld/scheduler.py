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
- Backfill: every job that cannot start gets a reservation (up to `reservations` of them): the
  earliest time, from the time limits of running jobs and of those started earlier in the same
  pass, from which enough nodes keep room for it beside the reservations made before it, and
  those nodes (of the nodes ready by then, the ones ready last, so that nodes free sooner stay
  for backfill). A later job may start now only where it delays no reservation: on nodes no
  reservation holds, or ending before the reservation starts, or using only what the
  reservations leave spare. Once the reservations run out, nothing after the job that found none
  starts in its partition: no job passes a higher-priority job that has no reservation.
- Preemption (airctld/preemption.py): a job whose QOS may preempt others, and that would not otherwise start within the
  preemption grace time, picks victims among running jobs of those QOS that it outranks
  (priority, then QOS priority): the fewest, lowest priority, most recently started jobs whose
  resources let it start. A stopping victim counts as ending when the grace it was given runs
  out. The nodes its victims free are held for the preemptor (`holds`) until it starts.

Two kinds of "no": `infeasible` says a request can never run (refused at submit); `schedule`
leaves a job pending with the reason it waits.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from air.protos.config import PartitionConfig, QosConfig
from air.airctld.model import Job, NodeAlloc
from air.airctld.priority import job_qos
from air.airctld import nodefilter
from air.airctld.nodefilter import NO_FILTER, ConstraintError, NodeFilter, parse_constraint
from air.airctld.preemption import may_preempt, place_holds, rank, victims  # noqa: F401 (rank: API)
from air.airctld.resources import FreeNode, free_resources, infeasible, pick_gpus  # noqa: F401 (the scheduler's API)
from air.protos.states import JobPhase, Reason

INF = float("inf")


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
    stopped_at: int = 0      # the first job the pass did not look at, when its time ran out
    holds: dict[int, tuple[str, ...]] = field(default_factory=dict)   # preemptor -> the nodes to hold for it

    def estimate(self) -> dict[int, Reservation]:
        return {r.job_id: r for r in self.reservations}


@dataclass(frozen=True)
class Limits:
    """QOS and account limits, as the pass needs them."""
    qos: Mapping[str, QosConfig] = field(default_factory=dict)
    default_qos: str = "normal"
    account_chain: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # account -> it and those above
    account_max_gpus: Mapping[str, int] = field(default_factory=dict)

    def qos_name(self, job: Job) -> str:
        return job_qos(job, self.default_qos)


def job_end(job: Job, now: float, completing_release_s: float, preempt_grace_s: float = 0.0,
            stopped_at: float | None = None) -> float:
    """When an active job's resources are expected back: its time limit; a stopping job once the
    grace time it was given runs out (the preemption grace for a preempted job, else the kill wait),
    counted from when it was asked to stop (from now, when that is not known)."""
    if job.phase == JobPhase.COMPLETING:
        grace = preempt_grace_s if job.reason == Reason.PREEMPTED else completing_release_s
        return max((now if stopped_at is None else stopped_at) + grace, now)
    if not job.time_limit_s:
        return INF
    return max(job.start_time + job.time_limit_s, now)


BAD = ("|", [])   # a constraint the parser refuses now (a stored job's): it matches nothing


@dataclass(frozen=True)
class _Eligible:
    names: frozenset   # the partition's nodes a filter lets a job use
    up: int
    drained: int
    bad_constraint: bool   # it names a feature no node has (any more), or does not parse
    listed_away: bool      # a node it lists is down, or no longer in the partition


class _Pass:
    """The mutable state of one pass: free resources by node, bucketed by free GPU count per
    partition, reservations, and the limits' running totals."""

    def __init__(self, free: dict[str, FreeNode], partitions: Mapping[str, PartitionConfig],
                 active: Sequence[Job], now: float, ends: Mapping[int, float], limits: Limits,
                 priority: Mapping[int, int]):
        self.free = free
        self.now = now
        self.limits = limits
        self.ends = ends          # active job -> when its resources come back
        self.active = active
        self.priority = priority
        self.part_nodes = {p: [n for n in part.nodes if n in free] for p, part in partitions.items()}
        # --switches needs a topology, as Slurm's needs topology/tree: without a `switch` on any node
        # (each is then a switch of its own) it is ignored
        self.topology = any(node.switch != node.name for node in free.values())
        self.max_gpus = {p: max((free[n].total_gpus for n in names), default=0) for p, names in self.part_nodes.items()}
        # buckets[p][k]: up nodes of partition p with exactly k free GPUs, in configuration order
        self.buckets: dict[str, list[dict[str, None]]] = {}
        self.node_parts: dict[str, list[str]] = {}
        self.sharing = {p: {q for q, other in self.part_nodes.items() if set(other) & set(names) or q == p}
                        for p, names in self.part_nodes.items()}   # partitions that share a node with p
        # group[p]: partitions joined through shared nodes, however indirectly; budgets count per group
        self.group: dict[str, str] = {p: p for p in self.part_nodes}
        def root(p: str) -> str:
            while self.group[p] != p:
                p = self.group[p]
            return p
        first_part: dict[str, str] = {}
        for p, names in self.part_nodes.items():
            for n in names:
                q = first_part.setdefault(n, p)
                a, b = root(p), root(q)
                if a != b:
                    self.group[max(a, b)] = min(a, b)
        self.group = {p: root(p) for p in self.part_nodes}
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
        self.res_list: dict[str, list[tuple[float, float, int, int, int]]] = {}   # node -> (start, end, gpus, cpus, job)
        self.res_of: dict[int, list[str]] = {}   # job -> the nodes of its reservation
        self._steps_cache: dict[str, list[tuple[float, int, int]]] = {}
        self.spare_gpus: dict[str, int] = {}
        self.spare_cpus: dict[str, int] = {}
        self.own: dict[tuple[str, int], tuple[int, int]] = {}   # (node, job) -> what the job holds there
        self._releases: dict[str, list[tuple[float, int, int]]] | None = None
        self._started: list[tuple[str, float, int, int]] = []   # this pass's starts, until releases() is built
        self._avail_heaps: dict[tuple, list[tuple[float, str]]] = {}
        self.res_pri: dict[int, int] = {}   # job -> its priority, for each job with a reservation
        self._filters: dict[tuple, NodeFilter] = {}   # -w/-x/-C/--exclusive texts -> the filter
        self._eligible: dict[tuple, _Eligible] = {}   # (partition, filter) -> the nodes it lets a job use
        self._by_feature: dict[str, set] | None = None   # feature -> the nodes that have it
        self._order: dict[str, dict[str, int]] = {}   # partition -> node -> its place in the partition
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

    def charge(self, job: Job, gpus: int | None = None) -> None:
        gpus = job.gpus_held if gpus is None else gpus
        qos = self.limits.qos_name(job)
        account = job.account
        key_u, key_a = (qos, job.user), (qos, account)
        self.used_qos_user[key_u] = self.used_qos_user.get(key_u, 0) + gpus
        self.used_qos_account[key_a] = self.used_qos_account.get(key_a, 0) + gpus
        for a in self.limits.account_chain.get(account, (account,)):
            self.used_account[a] = self.used_account.get(a, 0) + gpus
        if job.array_job_id:
            self.array_running[job.array_job_id] = self.array_running.get(job.array_job_id, 0) + 1

    def over_limit(self, job: Job, gpus: int | None = None) -> Reason | None:
        """The limit starting the job would pass, holding `gpus` GPUs (default: those it asks for)."""
        if not self.any_limit and not job.array_job_id:
            return None
        limits = self.limits
        gpus = job.num_nodes * job.gpus_per_node if gpus is None else gpus
        if job.array_job_id and job.request.array_max_running and \
                self.array_running.get(job.array_job_id, 0) >= job.request.array_max_running:
            return Reason.ARRAY_TASK_LIMIT
        if not gpus:
            return None
        qos_name = limits.qos_name(job)
        qos = limits.qos.get(qos_name)
        account = job.account
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

    # ---------------------------------------------------------------- -w, -x, -C, --exclusive

    def filter_of(self, job: Job) -> NodeFilter:
        """The job's -w/-x/-C/--exclusive (NO_FILTER without them), parsed once a pass for each text."""
        req = job.request
        if not (req.nodelist or req.exclude or req.constraint or req.exclusive):
            return NO_FILTER
        key = (tuple(req.nodelist), tuple(req.exclude), req.constraint, req.exclusive)
        filt = self._filters.get(key)
        if filt is None:
            try:
                expr = parse_constraint(req.constraint)
            except ConstraintError:   # (checked at submit; a stored job the parser now refuses runs nowhere)
                expr = BAD
            filt = self._filters[key] = NodeFilter(key[0], frozenset(key[1]), expr, key[3])
        return filt

    def eligible(self, job: Job, part: str) -> "_Eligible":
        """The nodes of the partition the job's filter lets it use, worked out once a pass for each
        filter: as set operations over an index of the nodes' features."""
        filt = self.filter_of(job)
        key = (part, filt.required, filt.excluded, job.request.constraint)
        got = self._eligible.get(key)
        if got is None:
            if self._by_feature is None:
                self._by_feature = nodefilter.index({n: f.features for n, f in self.free.items()}, self.free)
            in_part = set(self.part_nodes[part])
            if filt.constraint is BAD:
                names, bad = set(), True
            else:   # nothing matches, for a feature no node has (any more): BadConstraints
                names = nodefilter.select(filt.constraint, self._by_feature, in_part) & in_part - filt.excluded
                bad = not names and not nodefilter.features_named(filt.constraint) <= set(self._by_feature)
            mine = [self.free[n] for n in self.part_nodes[part] if n in names]
            got = self._eligible[key] = _Eligible(
                frozenset(names), sum(n.up for n in mine), sum(n.drained for n in mine), bad,
                any(r not in in_part or not self.free[r].up for r in filt.required))
        return got

    def need(self, job: Job, node: FreeNode) -> tuple[int, int]:
        """The GPUs and CPUs the job takes on the node: all of them for --exclusive."""
        if job.request.exclusive:   # (a node with fewer than it asks for never fits)
            return max(node.total_gpus, job.gpus_per_node), max(node.total_cpus, job.cpus_per_node)
        return job.gpus_per_node, job.cpus_per_node

    def _fits(self, job: Job, node: FreeNode, end: float, respect: bool) -> bool:
        g, c = self.need(job, node)   # (--exclusive: everything the node has, so only an idle node fits)
        return node.up and len(node.gpus) >= g and self.usable(node, g, c, end, respect, job.job_id)

    def usable(self, node: FreeNode, gpus: int, cpus: int, end: float, respect: bool, job_id: int = 0) -> bool:
        if node.cpus < cpus:
            return False
        if not respect:
            return True
        start = self.res_start.get(node.name)
        if start is None or end <= start:
            return True
        own_g, own_c = self.own.get((node.name, job_id), (0, 0))   # a job may use its own reservation
        return self.spare_gpus[node.name] + own_g >= gpus and self.spare_cpus[node.name] + own_c >= cpus

    def place(self, job: Job, part: str, end: float, respect: bool = True) -> tuple[NodeAlloc, ...] | None:
        """Nodes and GPUs for the job now, or None; `respect`: leave reservations whole. A job with a
        node filter (-w/-x/-C/--exclusive) looks only at the nodes it may use, and its listed nodes
        come first; the others are chosen as for any job."""
        n, g, c = job.num_nodes, job.gpus_per_node, job.cpus_per_node
        buckets = self.buckets[part]
        free = self.free
        filt = self.filter_of(job)
        chosen: list[FreeNode] = []
        if filt.restricts:
            allowed = self.eligible(job, part).names
            for name in filt.required:
                node = free.get(name)
                if node is None or name not in allowed or not self._fits(job, node, end, respect):
                    return None
                chosen.append(node)

            def fits(node: FreeNode) -> bool:
                return node.name in allowed and node.name not in filt.required and self._fits(job, node, end, respect)
        else:
            def fits(node: FreeNode) -> bool:
                return self.usable(node, g, c, end, respect, job.job_id)
        more = n - len(chosen)
        if more == 1 and not chosen:
            for k in range(g, len(buckets)):     # best fit: the fewest free GPUs that suffice
                for name in buckets[k]:
                    node = free[name]
                    if fits(node):
                        chosen = [node]
                        break
                if chosen:
                    break
        elif more > 0:
            near = {node.switch for node in chosen}   # the listed nodes' switches: the rest under them
            by_switch: dict[str, list[FreeNode]] = {}
            whole = None
            for k in range(g, len(buckets)):
                for name in buckets[k]:
                    node = free[name]
                    if not fits(node):
                        continue
                    group = by_switch.setdefault(node.switch, [])
                    group.append(node)
                    if len(group) >= more and (not near or node.switch in near):
                        whole = group
                        break
                if whole:
                    break
            if whole:
                chosen += whole[:more]
            else:
                if sum(len(v) for v in by_switch.values()) < more:
                    return None
                # the listed nodes' switches first (they add none), then the largest: the fewest switches
                groups = sorted(by_switch.items(), key=lambda kv: (kv[0] not in near, -len(kv[1]), kv[0]))
                for _, group in groups:
                    chosen.extend(group[:n - len(chosen)])
                    if len(chosen) == n:
                        break
        if len(chosen) < n:
            return None
        wanted = job.request.switches   # --switches: wait for so few leaf switches, up to its time
        if wanted and n > 1 and self.topology and len({node.switch for node in chosen}) > wanted and \
                self.now - job.submit_time < job.request.switches_wait_s and \
                len({node.switch for node in chosen if node.name in filt.required}) <= wanted:
            return None   # (the nodes it lists may span more already: no wait can help that)
        if filt.restricts:   # in the partition's order (as Slurm's: its first node runs the batch script)
            order = self._order.get(part)
            if order is None:
                order = self._order[part] = {name: i for i, name in enumerate(self.part_nodes[part])}
            chosen.sort(key=lambda node: order[node.name])
        if not filt.exclusive:
            return tuple(NodeAlloc(node.name, pick_gpus(node.gpus, g, node.total_gpus, node.domains), c)
                         for node in chosen)
        return tuple(NodeAlloc(node.name, tuple(node.gpus), node.cpus) for node in chosen)   # all of each

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
            if self._releases is not None:
                self._releases.setdefault(a.node, []).append((end, len(a.gpus), a.cpus))
                self._releases[a.node].sort()
            else:
                self._started.append((a.node, end, len(a.gpus), a.cpus))
        # a job that starts gives up its reservation (it may start elsewhere than reserved); what the
        # reservations leave spare on each node touched is worked out again
        for a in alloc:
            self._steps_cache.pop(a.node, None)
        touched = {a.node for a in alloc if a.node in self.res_start or (a.node, job.job_id) in self.own}
        self.drop(job.job_id, touched)
        self.charge(job, sum(len(a.gpus) for a in alloc))

    def drop(self, job_id: int, touched: set[str] | None = None) -> None:
        """Remove the job's reservation, and work out again what the reservations leave spare on its
        nodes (and on `touched`)."""
        touched = set(touched or ())
        if job_id in self.res_of:   # nodes get free sooner: the search's lower bounds no longer hold
            self._avail_heaps.clear()
        for name in self.res_of.pop(job_id, ()):
            self.own.pop((name, job_id), None)
            self.res_list[name] = [r for r in self.res_list[name] if r[4] != job_id]
            self._steps_cache.pop(name, None)
            touched.add(name)
        for name in touched:
            if self.res_list.get(name):
                self.res_start[name] = min(r[0] for r in self.res_list[name])
                self.spare_gpus[name], self.spare_cpus[name] = self._spare(name)
            else:
                for d in (self.res_list, self.res_start, self.spare_gpus, self.spare_cpus):
                    d.pop(name, None)

    # ---------------------------------------------------------------- reservations

    def releases(self) -> dict[str, list[tuple[float, int, int]]]:
        """When each node gets resources back: running jobs at their time limits, and the jobs this
        pass started at theirs (a start earlier in the pass ends too, and a reservation may wait for it)."""
        if self._releases is None:
            rel: dict[str, list[tuple[float, int, int]]] = {}
            for job in self.active:
                end = self.ends[job.job_id]
                for a in job.allocation:
                    rel.setdefault(a.node, []).append((end, len(a.gpus), a.cpus))
            for node, end, g, c in self._started:
                rel.setdefault(node, []).append((end, g, c))
            for v in rel.values():
                v.sort()
            self._releases = rel
        return self._releases

    def _steps(self, name: str):
        """(time, free GPUs, free CPUs) on the node after each change to come: jobs ending, and
        reservations starting and ending; the first entry is now."""
        cached = self._steps_cache.get(name)
        if cached is not None:
            return cached
        node = self.free[name]
        g, c = len(node.gpus), node.cpus
        events = list(self.releases().get(name, ()))
        for start, end, rg, rc, _ in self.res_list.get(name, ()):
            events.append((start, -rg, -rc))
            if end < INF:
                events.append((end, rg, rc))
        events.sort()
        out = [(self.now, g, c)]
        i = 0
        while i < len(events):
            t = events[i][0]
            while i < len(events) and events[i][0] == t:
                g += events[i][1]
                c += events[i][2]
                i += 1
            if t <= self.now:
                out[0] = (self.now, g, c)
            else:
                out.append((t, g, c))
        self._steps_cache[name] = out
        return out

    def available_from(self, name: str, gpus: int, cpus: int) -> float:
        """The earliest time from which the node keeps room for `gpus` and `cpus` at every later moment,
        beside the reservations it has: a reservation never goes into a gap before another one."""
        if name not in self.res_list:   # no reservation: free only grows, the first time it suffices
            node = self.free[name]
            g, c = len(node.gpus), node.cpus
            if g >= gpus and c >= cpus:
                return self.now
            for t, rg, rc in self.releases().get(name, ()):
                g += rg
                c += rc
                if g >= gpus and c >= cpus:
                    return max(t, self.now)
            return INF
        steps = self._steps(name)
        for k in range(len(steps) - 1, -1, -1):   # from the end: the last moment without room
            _, g, c = steps[k]
            if g < gpus or c < cpus:
                return steps[k + 1][0] if k + 1 < len(steps) else INF
        return self.now

    def _spare(self, name: str) -> tuple[int, int]:
        """What the node has free at every moment from its first reservation on: what a job running
        past that start may use."""
        first = self.res_start[name]
        steps = self._steps(name)
        before = [s for s in steps if s[0] <= first]
        after = before[-1:] + [s for s in steps if s[0] > first]
        return min(g for _, g, _ in after), min(c for _, _, c in after)

    def reserve(self, job: Job, part: str, only: Iterable[str] | None = None, not_before: float = 0.0
                ) -> Reservation | None:
        """The earliest time (not before `not_before`) at which the job's nodes are free for it, beside or
        after the reservations made before it, and those nodes (among `only`, when given); the job holds
        them from then on. (A node with room from t on has room from any later time on.) A job with a
        node filter looks only at the nodes it may use, and holds its listed nodes whatever their time."""
        n, g, c = job.num_nodes, job.gpus_per_node, job.cpus_per_node
        filt = self.filter_of(job)
        free = self.free
        listed = filt.required
        if filt.restricts:
            allowed = self.eligible(job, part).names

            def avail(name: str) -> float:
                return self.available_from(name, *self.need(job, free[name]))
        else:
            allowed = None

            def avail(name: str) -> float:
                return self.available_from(name, g, c)
        start_listed = not_before
        for name in listed:
            if name not in allowed or not free[name].up or (only is not None and name not in only):
                return None
            start_listed = max(start_listed, avail(name))
        if start_listed == INF:
            return None
        more = n - len(listed)
        if only is not None:
            heap = [(avail(name), name) for name in sorted(set(only))
                    if name in free and free[name].up and part in self.node_parts.get(name, ())
                    and (allowed is None or name in allowed) and name not in listed]
            heapq.heapify(heap)
        else:
            key = (part, g, c) if allowed is None else (part, g, c, listed, filt.excluded, job.request.constraint,
                                                        filt.exclusive)
            base = self._avail_heaps.get(key)
            if base is None:
                base = [(avail(name), name) for name in self.part_nodes[part]
                        if free[name].up and (allowed is None or name in allowed) and name not in listed]
                heapq.heapify(base)
                self._avail_heaps[key] = base
            heap = base   # its times are lower bounds (they only grow, but for drop()): refreshed as popped
        ready: list[tuple[float, str]] = []   # nodes by the time they can hold the job, earliest first
        while heap and more:
            t, name = heap[0]
            if t == INF or (len(ready) >= more and t > ready[more - 1][0]):
                break
            heapq.heappop(heap)
            exact = avail(name)
            if exact == t:
                ready.append((t, name))
            elif exact < INF:   # a node that can never hold the job this pass leaves the heap
                heapq.heappush(heap, (exact, name))
        for entry in ready:
            heapq.heappush(heap, entry)
        if len(ready) < more:
            return None
        start = max(ready[more - 1][0], start_listed) if more else start_listed
        # of the nodes ready by then, those that are ready last: the ones free sooner stay for backfill
        chosen = sorted(ready, key=lambda tn: (-tn[0], tn[1]))[:more]
        return self.hold(job, tuple(sorted(listed + tuple(name for _, name in chosen))), start)

    def hold(self, job: Job, names: tuple[str, ...], start: float) -> Reservation:
        """Reserve `names` for the job from `start` on."""
        g, c = job.gpus_per_node, job.cpus_per_node
        end = start + job.time_limit_s if job.time_limit_s else INF
        self.res_pri[job.job_id] = self.priority.get(job.job_id, job.priority)
        for name in names:
            if job.request.exclusive:
                g, c = self.need(job, self.free[name])
            self.res_start[name] = min(self.res_start.get(name, INF), start)
            self.res_list.setdefault(name, []).append((start, end, g, c, job.job_id))
            self._steps_cache.pop(name, None)
            self.own[(name, job.job_id)] = (g, c)
            self.res_of.setdefault(job.job_id, []).append(name)
            self.spare_gpus[name], self.spare_cpus[name] = self._spare(name)
        return Reservation(job.job_id, start, end, names, g, c)



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
    if part.accounts and (job.account) not in part.accounts:
        return Reason.ACCOUNT_NOT_ALLOWED
    return state.over_limit(job)


def pass_order(pending: Iterable[Job], priority: Mapping[int, int]) -> list[Job]:
    """The order a pass looks at jobs in: priority (highest first), then submit time, then id."""
    pri_get = priority.get
    return sorted(pending, key=lambda j: (-pri_get(j.job_id, j.priority), j.submit_time, j.job_id))


def schedule(pending: Iterable[Job], free: dict[str, FreeNode], partitions: Mapping[str, PartitionConfig], *,
             now: float = 0.0, active: Sequence[Job] = (), priority: Mapping[int, int] | None = None,
             blocked: Mapping[int, Reason] | None = None, limits: Limits | None = None,
             reservations: int = 1000, completing_release_s: float = 30.0,
             preempt_grace_s: float = 30.0, backfill: bool = True,
             stopped_at: Mapping[int, float] | None = None,
             holds: Mapping[int, Iterable[str]] | None = None,
             preempted: Mapping[int, Iterable[int]] | None = None,
             not_before: Mapping[int, float] | None = None,
             max_pass_s: float = 0.0, timer: Callable[[], float] | None = None, in_order: bool = False) -> Plan:
    """Decide which pending jobs start now and why the others wait. `free` is updated in place.

    `priority` maps job ids (pending and running) to their priority (default: the job's own
    field); `blocked` gives jobs that wait for a reason decided outside the pass (dependencies);
    `active` are the running and completing jobs, whose time limits place reservations and whose
    QOS may make them victims; `stopped_at` says when each stopping job was asked to stop; `holds`
    maps a pending preemptor to the nodes its victims free, held for it alone until it starts (while
    it could start: not held, blocked or over a limit); `preempted` maps a preemptor to the jobs it
    has preempted already, which it never preempts again; `not_before` maps a job to a time before
    which it may not start (a requeued job whose last run's nodes may still run it, until their
    fence): it is reserved from then, so nothing below it backfills past it meanwhile;
    `in_order`: `pending` is in the pass's order already (as `pass_order` gives it).

    Backfill never delays a higher-priority job: each job that cannot start gets a reservation
    (the first `reservations` of them); once that many are made, a job that finds no room waits
    and nothing after it starts in its partition (or one sharing its nodes), so no job without a
    reservation is passed. The count is per group of partitions that share nodes: a busy
    partition does not switch backfill off in an unrelated one. With `max_pass_s` and a `timer`
    (the caller's clock), the pass stops looking at further jobs once that long has passed (as
    Slurm's bf_max_time): the jobs not reached wait, keeping the reason an earlier pass gave them,
    and nothing after them starts. With `backfill` off, the first job that cannot start in a partition
    holds back every job after it there (strict priority order; for comparison in bench/)."""
    priority = priority or {}
    blocked = blocked or {}
    limits = limits or Limits()
    stopped_at = stopped_at or {}
    plan = Plan()
    ends = {j.job_id: job_end(j, now, completing_release_s, preempt_grace_s, stopped_at.get(j.job_id))
            for j in active}
    state = _Pass(free, partitions, active, now, ends, limits, priority)
    victims_taken: set[int] = set()
    preemptable = None
    preempted = preempted or {}
    not_before = not_before or {}
    no_cache: dict[tuple, tuple[int, Reason]] = {}   # a shape that could not start, until resources change
    generation = 0
    waiting = plan.waiting
    stalled: set[str] = set()   # partitions where no later job may start
    order = list(pending) if in_order else pass_order(pending, priority)
    held_for = place_holds(order, holds or {}, lambda j: _held_back(j, blocked, partitions, state) is not None,
                           state, plan, not_before)
    reserved: dict[str, int] = {}   # reservations made, by group of partitions sharing nodes
    deadline = timer() + max_pass_s if timer is not None and max_pass_s > 0 else None
    filtered = False   # the job before had a node filter (its placement walks its nodes: look at the clock)
    for k, job in enumerate(order):
        if deadline is not None and k and (not k & 15 or filtered) and timer() > deadline:   # a reservation may take ms
            plan.stopped_at = job.job_id
            break
        job_id = job.job_id
        reason = _held_back(job, blocked, partitions, state)
        if reason is not None:
            waiting[job_id] = reason
            continue
        name = job.partition
        if name in stalled:
            waiting[job_id] = Reason.PRIORITY
            continue
        req = job.request
        qos = limits.qos.get(limits.qos_name(job))
        preemptor = qos is not None and bool(qos.preempt)
        shape = (job.partition, job.num_nodes, job.gpus_per_node, job.cpus_per_node, job.time_limit_s,
                 req.switches, job.submit_time if req.switches else 0)
        end = now + job.time_limit_s if job.time_limit_s else INF
        filt = state.filter_of(job)
        filtered = filt.restricts
        if filtered:
            shape += (filt.required, filt.excluded, req.constraint, filt.exclusive)
            eligible = state.eligible(job, name)
            if eligible.bad_constraint:
                waiting[job_id] = Reason.BAD_CONSTRAINTS
                continue
            # (a listed node down, or gone from the partition since submit: ReqNodeNotAvail)
            up, drained, down = eligible.up, eligible.drained, eligible.listed_away
        else:
            up, drained, down = state.up_count[name], state.drained_count[name], False
        if up < job.num_nodes or down:
            reason = Reason.NODES_DRAINED if not down and up + drained >= job.num_nodes else Reason.NODES_DOWN
            waiting[job_id] = reason
            no_cache[shape] = (generation, reason)
            continue
        cached = no_cache.get(shape)
        alloc = None
        later = not_before.get(job_id, 0.0)
        if later <= now and (cached is None or cached[0] != generation or preemptor or job_id in held_for):
            cached = None
            if filt.restricts or state.count_fitting(name, job.gpus_per_node) >= job.num_nodes:
                alloc = state.place(job, name, end)
        if alloc is not None and filt.exclusive:   # the limits count every GPU of its nodes, not those asked for
            over = state.over_limit(job, sum(len(a.gpus) for a in alloc))
            if over is not None:
                waiting[job_id] = over
                continue
        if alloc is not None:
            state.take(job, alloc, end)
            plan.starts.append((job_id, alloc))
            generation += 1
            continue
        if later > now:
            pass   # it keeps the reason it was requeued with
        elif cached is not None:
            waiting[job_id] = cached[1]
        else:
            reason = Reason.RESOURCES
            if state.res_start and (filt.restricts or state.count_fitting(name, job.gpus_per_node) >= job.num_nodes) \
                    and state.place(job, name, end, respect=False) is not None:
                reason = Reason.PRIORITY
            no_cache[shape] = (generation, reason)
            waiting[job_id] = reason
        if not backfill:
            stalled.add(name)
        res = held_for.get(job_id)
        group = state.group[name]
        if res is None and (reserved.get(group, 0) < reservations or preemptor):
            res = state.reserve(job, name, not_before=later)
            if res is not None:
                plan.reservations.append(res)
                reserved[group] = reserved.get(group, 0) + 1
        elif res is None and backfill:
            stalled.update(state.sharing[name])   # no reservation left to protect it: pass nobody
        if preemptor and later <= now and (res is None or res.start > now + preempt_grace_s):
            if preemptable is None:
                preemptable = [j for j in active if j.phase == JobPhase.RUNNING]
            before = preempted.get(job_id, ())
            candidates = [v for v in preemptable if v.job_id not in before and may_preempt(job, v, limits, priority)]
            chosen, nodes = victims(state, job, name, candidates, victims_taken, now + preempt_grace_s)
            if chosen:
                plan.preempt[job_id] = chosen
                plan.holds[job_id] = nodes
                victims_taken.update(chosen)
                # the nodes are the preemptor's from when its victims are gone, in this pass already
                if res is not None:
                    plan.reservations.remove(res)
                    state.drop(job_id)
                plan.reservations.append(state.hold(job, nodes, now + preempt_grace_s))
            else:
                above = [v for v in preemptable if limits.qos_name(v) in qos.preempt
                         and v.job_id not in {c.job_id for c in candidates} and v.job_id not in before]
                if above:
                    v = max(above, key=lambda v: rank(v, limits, priority))
                    plan.details[job_id] = (f"may not preempt job {v.job_id}: it ranks higher (priority "
                                            f"{rank(v, limits, priority)[0]} against {rank(job, limits, priority)[0]})")
    return plan
