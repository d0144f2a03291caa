"""The controller's scheduling pass: snapshot under the lock, plan with the pure scheduler without
it, apply under it what still holds; and the job states that dependencies are judged on."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Mapping

import hostlist

from air.airctld import events, scheduler
from air.airctld.accounting import Accounting
from air.airctld.jobtable import JobTable
from air.airctld.metrics import ControllerMetrics
from air.airctld.model import Job, Node, evolve
from air.airctld.node_reports import CONTROLLER_UID
from air.airctld.planning import Planner
from air.airctld.store import Store
from air.protos.states import JobPhase, JobResult, NodeState

log = logging.getLogger("airctld")

FULL_PASS_EVERY_S = 10.0   # a pass even when nothing changed: waits that expire (--switches), ages


class SchedulingPass:
    """Plans and applies the controller's scheduling passes, and judges dependencies. A collaborator of
    the controller: what it reads and changes is given to it.

    store, lock, jobs, nodes: the controller's store, its lock, its job table and its nodes (read under
    the lock); planner, accounting, metrics: the controller's; clock, mono: the wall and the monotonic
    clock; partitions, switches, features: the cluster's partitions, and its nodes' switches and
    features (read only); commit: the controller's way to record a job's change; launch: queues a
    started run's launch; terminate: stops the jobs a pass preempted, given the runs still launching.
    Shared with the controller: arrays (array -> its tasks), fence_wait (a requeued job's nodes that
    may still run it), suspect (nodes a step lost), stopped_at, holds and preempted (a stop's time, the
    nodes held for a preemptor and its victims so far), launching ((job, run) whose launch has not
    returned: the pass adds its starts), warned (jobs given their --signal warning: a start clears it).
    Its own, which the controller changes too (under the lock): dirty (something changed that may
    let a pending job start), epoch (bumped by every change to what priorities are made of), released
    (the last priorities of jobs released since the pass's snapshot); and pass_seconds (how long the
    last plan took), which the controller's loop reads."""

    def __init__(self, store: Store, lock: threading.RLock, jobs: JobTable, nodes: Mapping[str, Node],
                 planner: Planner, accounting: Accounting, metrics: ControllerMetrics, clock: Callable[[], float],
                 mono: Callable[[], float], commit: Callable[[list[tuple[Job, Job]], float, int], list[Job]],
                 launch: Callable[[Job], None], terminate: Callable[[list[Job], set[tuple[int, int]]], None], *,
                 partitions: Mapping, switches: Mapping[str, str], features: Mapping[str, frozenset],
                 arrays: dict[int, list[int]], fence_wait: dict[int, dict[str, float]], suspect: dict[str, float],
                 stopped_at: dict[int, float], holds: dict[int, tuple[str, ...]], preempted: dict[int, set[int]],
                 launching: set[tuple[int, int]], warned: set[int]):
        self.store = store
        self._lock = lock
        self.jobs = jobs
        self.nodes = nodes
        self.planner = planner
        self.accounting = accounting
        self.metrics = metrics
        self.clock = clock
        self.mono = mono
        self._commit = commit
        self._launch = launch
        self._terminate = terminate
        self.partitions = partitions
        self.switches = switches
        self.features = features
        self._arrays = arrays
        self.fence_wait = fence_wait
        self.suspect = suspect
        self._stopped_at = stopped_at
        self._holds = holds
        self._preempted = preempted
        self._launching = launching
        self._warned = warned
        self._not_arrays: set[int] = set()   # ids the store has no array of
        self.dirty = True   # something changed that may let a pending job start
        self.epoch = 0      # bumped by every change to what priorities are made of (accounts)
        self.released: list[int] = []   # the last priorities of jobs released since the pass's snapshot
        self.pass_seconds = 0.0
        self._last_pass = 0.0
        self._due = float("inf")   # when a pending job's --begin time comes

    def dep_states(self, job_id: int) -> list[tuple[JobPhase, JobResult]]:
        """The state of a job, or of every task of the array with that id, for dependencies."""
        ids = self._arrays.get(job_id)
        if ids is None:
            if job_id in self._not_arrays or job_id in self.jobs:
                ids = [job_id]
            else:   # a job done and forgotten, or an array whose tasks all are: the store knows
                ids = [t.job_id for t in self.store.array_tasks(job_id)]
                if ids:
                    self._arrays[job_id] = ids
                else:
                    self._not_arrays.add(job_id)
                    ids = [job_id]
        out = []
        for i in ids:
            job = self.jobs.get(i) or self.store.get_job(i)
            if job is not None:
                out.append((job.phase, job.result))
        return out

    def _capacity(self) -> tuple[int, int]:
        return sum(len(n.gpus) for n in self.nodes.values()), sum(n.cpus for n in self.nodes.values())

    def prime(self) -> None:
        """Every job's priority worked out once, at start, before the first pass: filling the priority
        cache is the dearest part of a pass, so the first pass then costs what any later one does."""
        with self._lock:
            pending, held, active = self.jobs.schedulable(), self.jobs.held(), self.jobs.active()
            capacity = self._capacity()
        if pending or held or active:
            self.planner.inputs(pending, held, active, self.accounting, capacity, self.clock(), self.dep_states)

    def schedule(self, now: float) -> None:
        """Snapshot under the lock, plan without it, apply what still holds under it.

        Only this loop starts jobs, so resources free in the snapshot cannot be taken meanwhile. A
        plan is applied only to jobs whose record is the one it was made from (still pending, not
        held, not changed), whose dependencies still hold, while nothing that priorities are made of
        changed (the epoch: accounts), and that rank above every job released meanwhile (which the
        plan did not see); anything else waits for the next pass. A hold or release that changes
        nothing, or a hold, stops no other job's start.
        """
        with self._lock:
            if not self.dirty and now - self._last_pass < FULL_PASS_EVERY_S and now < self._due:
                return
            self.dirty = False
            self._last_pass = now
            pending = self.jobs.schedulable()  # held jobs keep the JobHeldUser reason set at submit
            self._due = min((j.request.begin_time for j in pending if j.request.begin_time > now), default=float("inf"))
            mono = self.mono()
            fenced = {j: max(w.values()) for j, w in self.fence_wait.items() if max(w.values()) > mono}
            # (a launch of the job's earlier run that is still out may still start it: the wait lasts,
            # whatever the fence, until that launch has returned; looked at again shortly)
            fenced.update({j: mono + 0.5 for j, _ in self._launching if j in self.fence_wait and j not in fenced})
            for job_id in set(self.fence_wait) - set(fenced):
                del self.fence_wait[job_id]
            if fenced:   # a job whose lost nodes may still run its ranks waits for their fence (reserved)
                self._due = min(self._due, now + min(fenced.values()) - mono)
            gone = [p for p in self._holds if (j := self.jobs.get(p)) is None or j.phase != JobPhase.PENDING]
            ended = [p for p in self._preempted if (j := self.jobs.get(p)) is None or j.phase == JobPhase.DONE]
            if gone or ended:   # started, or left the queue; held or fenced, it keeps its hold
                with self.store.transaction():
                    self.store.remove_holds(gone)
                    self.store.remove_preemptions(ended)
                for preemptor in gone:
                    del self._holds[preemptor]
                for preemptor in ended:   # (one that runs, or is requeued, still never takes a victim again)
                    del self._preempted[preemptor]
            held = self.jobs.held()
            if not pending and not held:   # (held jobs alone: their priorities are still worked out)
                return
            snapshot = {j.job_id: j for j in pending}
            epoch = self.epoch
            self.released = []
            active = self.jobs.active()
            nodes = [evolve(n, state=NodeState.DOWN) if n.name in self.suspect else n for n in self.nodes.values()]
            free = scheduler.free_resources(nodes, active, self.switches, self.planner.gpu_memo, self.features)
            capacity = self._capacity()
            stopped_at, holds = dict(self._stopped_at), dict(self._holds)
            preempted_before = {p: frozenset(v) for p, v in self._preempted.items()}
        # planned from the snapshot alone: requests change the job table meanwhile (dependencies on jobs
        # not in it are looked up as they are, in memory or in the store)
        began = time.perf_counter()
        inputs = self.planner.inputs(pending, held, active, self.accounting, capacity, now, self.dep_states)
        order = inputs.pop("order")
        plan = scheduler.schedule(order, free, self.partitions, stopped_at=stopped_at, holds=holds, in_order=True,
                                  preempted=preempted_before, **inputs,
                                  not_before={j: now + (t - mono) for j, t in fenced.items()})   # (on the plan's clock)
        self.pass_seconds = time.perf_counter() - began
        looked_at = len(order)
        if plan.stopped_at:   # the pass's time ran out: the jobs before that one
            looked_at = next((i for i, j in enumerate(order) if j.job_id == plan.stopped_at), looked_at)
        self.metrics.scheduled(self.pass_seconds, looked_at)
        with self._lock:
            # a job released meanwhile was not in the plan: only jobs that rank above it may start
            floor = max(self.released, default=None)
            planned = inputs["priority"]

            def unchanged(job_id: int) -> bool:
                return self.jobs.get(job_id) is snapshot.get(job_id) and self.epoch == epoch and \
                    (floor is None or planned.get(job_id, 0) > floor)

            preempted, new_holds, pairs = [], {}, []
            for preemptor, victims in plan.preempt.items():
                if not unchanged(preemptor):
                    self.dirty = True
                    continue
                stopping = [j for v in victims if (j := self.jobs.get(v)) is not None and j.phase == JobPhase.RUNNING]
                preempted += [(j, events.preempted(j, now, preemptor)) for j in stopping]
                pairs += [(preemptor, j.job_id) for j in stopping]
                new_holds[preemptor] = plan.holds.get(preemptor, ())
            starts = []
            for job_id, alloc in plan.starts:
                job = self.jobs.get(job_id)
                if not unchanged(job_id) or any(self.nodes[a.node].state != NodeState.UP for a in alloc) or \
                        job_id in fenced or not self.planner.still_free(job, self.dep_states):
                    self.dirty = True
                    continue
                # started with the priority this pass gave it (shown by airq and kept across a restart)
                starts.append((job, events.start(evolve(job, priority=planned.get(job_id, job.priority)), now, alloc)))
            mono = self.mono()
            for job_id in fenced:   # (the plan leaves them their requeue's reason): say what they wait for
                job = self.jobs.get(job_id)
                if job is None or job.phase != JobPhase.PENDING or job.hold or job_id in plan.waiting:
                    continue
                nodes = [n for n, by in self.fence_wait.get(job_id, {}).items() if by > mono]
                if nodes:
                    plan.waiting[job_id] = job.reason
                    plan.details[job_id] = (f"its last run may still be on {hostlist.collect_hostlist(nodes)}: it "
                                            "waits until each has reported that run gone or has surely fenced itself")
            reasons = [(i, r) for i, r in plan.waiting.items()
                       if (j := self.jobs.get(i)) is not None and j.phase == JobPhase.PENDING and not j.hold
                       and (j.reason != r or j.reason_detail != plan.details.get(i, ""))]
            # a second round of victims adds to the first; a preemptor that starts gives its hold up
            holds = {p: tuple(sorted(set(self._holds.get(p, ())) | set(nodes))) for p, nodes in new_holds.items()}
            ended = [job.job_id for job, _ in starts if job.job_id in self._holds]
            try:   # memory takes the starts, stops, holds and reasons only once all are written
                with self.store.transaction():
                    started = self._commit(starts, now, CONTROLLER_UID)
                    stopping = self._commit(preempted, now, CONTROLLER_UID)
                    self.store.save_holds(holds)
                    self.store.add_preemptions(pairs)
                    self.store.remove_holds(ended)
                    self.store.set_pending_reasons(reasons)
            except Exception:
                self.dirty = True   # the next pass plans again
                raise
            self._holds.update(holds)
            for preemptor, victim in pairs:
                self._preempted.setdefault(preemptor, set()).add(victim)
            for preemptor in ended:
                del self._holds[preemptor]
            for i, r in reasons:
                self.jobs.put(events.waiting(self.jobs.get(i), r, plan.details.get(i, "")))
            for job_id, value in inputs["priority"].items():   # what this pass used, pending and running
                job = self.jobs.get(job_id)
                if job is not None and job.phase in (JobPhase.PENDING, JobPhase.RUNNING) and job.priority != value:
                    self.jobs.put(evolve(job, priority=value))
            self.planner.plan = plan
            self._launching.update((j.job_id, j.restart_count) for j in started)
            self._warned.difference_update(j.job_id for j in started)   # a new run gets its own warning
            launching = set(self._launching)
        for job in started:
            self._launch(job)
        for job in stopping:
            log.info("job %d preempted: %s", job.job_id, job.reason_detail)
        self._terminate(stopping, launching)
