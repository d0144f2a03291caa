"""What a scheduling pass needs besides free resources, gathered from the controller's state:
priorities (multifactor, with fairshare from the accounting), dependency and singleton waits,
and the QOS and account limits. Also keeps what the last pass decided about pending jobs, for
airq --priority and --start."""
from __future__ import annotations

import time

from typing import Callable

from air.airctld import deps, scheduler
from air.airctld.accounting import Accounting
from air.protos.config import Config
from air.airctld.model import Job
from air.airctld.priority import PriorityModel, job_qos
from air.airctld.priority_cache import LEAF, PriorityCache
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, JobResult, Reason


class Planner:
    def __init__(self, config: Config):
        self.config = config
        self.partitions = {p.name: p for p in config.partitions}
        self.qos = {q.name: q for q in config.qos}
        self._deps: dict[int, deps.Dependency | None] = {}
        self._final: dict[int, tuple[JobPhase, JobResult]] = {}   # states of done jobs looked up in the store
        self.model: PriorityModel | None = None
        self.priorities = PriorityCache()
        self.gpu_memo: dict[int, tuple] = {}   # for scheduler.free_resources, from pass to pass
        self.plan = scheduler.Plan()

    def dependency(self, job: Job) -> deps.Dependency | None:
        if job.job_id not in self._deps:
            self._deps[job.job_id] = deps.parse(job.request.dependency) if job.request.dependency else None
        return self._deps[job.job_id]

    def forget(self, job_id: int) -> None:
        self._deps.pop(job_id, None)

    def inputs(self, pending: list[Job], held: list[Job], active: list[Job], accounting: Accounting,
               capacity: tuple[int, int], now: float,
               lookup: Callable[[int], list[tuple[JobPhase, JobResult]]]) -> dict:
        """Keyword arguments for scheduler.schedule beyond the snapshot of nodes, and `order`: the pending
        jobs in the pass's order, to give it with in_order=True. From lists taken under the controller's
        lock (pending, held and active jobs), never from the live job table."""
        # every job's priority as this pass sees it: pending, held and running alike (victims are
        # ranked by it, and aircontrol show job and airq -o %Q show it); fairshare over the leaves of
        # the pending and active jobs. The cache gives what PriorityModel.priorities would.
        statics = PriorityModel(self.config.scheduler, self.partitions, self.qos, {}, *capacity)
        rows = self.priorities.rows([*pending, *held, *active], statics)
        leaves = {r[LEAF] for r in rows[:len(pending)]} | {r[LEAF] for r in rows[len(pending) + len(held):]}
        shares = accounting.shares(leaves)
        fs = {k: s.fairshare for k, s in shares.items() if k[1]}
        self.model = PriorityModel(self.config.scheduler, self.partitions, self.qos, fs, *capacity)
        priority = self.priorities.priorities(rows, fs, now)
        order = self.priorities.order(pending)   # the pass's order, as schedule() sorts it
        blocked = self._blocked(pending, active, lookup, now)
        chains, quotas = accounting.account_chains()
        limits = scheduler.Limits(qos=self.qos, default_qos=self.config.scheduler.default_qos,
                                  account_chain=chains, account_max_gpus=quotas)
        s = self.config.scheduler
        return dict(order=order, now=now, active=active, priority=priority, blocked=blocked, limits=limits,
                    reservations=s.reservations, completing_release_s=self.config.controller.kill_wait_s,
                    preempt_grace_s=s.preempt_grace_s, max_pass_s=s.max_pass_s, timer=time.perf_counter)

    def still_free(self, job: Job, lookup: Callable[[int], list[tuple[JobPhase, JobResult]]]) -> bool:
        """Whether the job's dependency (singleton aside) still holds, as its start is applied."""
        dep = self.dependency(job)
        if dep is None or dep.singleton:
            return True
        return deps.evaluate(dep, lookup, True) == deps.DepState.SATISFIED

    def views(self, jobs: list[Job], now: float) -> list[pb.PendingJob]:
        s = self.config.scheduler
        weights = [s.weight_age, s.weight_fairshare, s.weight_jobsize, s.weight_partition, s.weight_qos]
        estimates = self.plan.estimate()
        out = []
        for job in sorted(jobs, key=lambda j: j.job_id):
            view = pb.PendingJob(job_id=job.job_id, user=job.user, name=job.name,
                                 account=job.account, partition=job.partition,
                                 qos=job_qos(job, s.default_qos), reason=job.reason, weights=weights)
            if self.model is not None:
                f = self.model.factors(job, now)
                view.priority, view.age, view.fairshare, view.jobsize = f.priority, f.age, f.fairshare, f.jobsize
                view.partition_factor, view.qos_factor, view.nice = f.partition, f.qos, f.nice
            res = estimates.get(job.job_id)
            if res is not None:
                view.est_start = res.start
                view.est_nodes.extend(res.nodes)
            out.append(view)
        return out

    def _blocked(self, pending: list[Job], active: list[Job],
                 lookup: Callable[[int], list[tuple[JobPhase, JobResult]]], now: float) -> dict[int, Reason]:
        out = {j.job_id: Reason.BEGIN_TIME for j in pending if j.request.begin_time > now}
        waiting = [(j, d) for j in pending if (d := self.dependency(j)) is not None and j.job_id not in out]
        if not waiting:
            return out
        singles: dict[tuple[str, str], int] = {}
        if any(d.singleton for _, d in waiting):
            for j in active:
                singles[(j.user, j.name)] = -1  # one of that name runs: every singleton waits
            for j, d in sorted(waiting, key=lambda jd: (jd[0].submit_time, jd[0].job_id)):
                if d.singleton:
                    singles.setdefault((j.user, j.name), j.job_id)
        for job, dep in waiting:
            free = singles.get((job.user, job.name)) == job.job_id
            state = deps.evaluate(dep, lookup, free)
            if state == deps.DepState.WAITING:
                out[job.job_id] = Reason.DEPENDENCY
            elif state == deps.DepState.NEVER:
                out[job.job_id] = Reason.DEPENDENCY_NEVER
        return out
