"""The controller's one stateful core: requests and node reports in, decisions out.

Every change follows the same order: compute the new records with the pure functions in
`events` and `scheduler`, write them in one store transaction, then update memory, then
act (launch or signal through node daemons) outside the lock. Memory holds the jobs that
are not done and the recently done ones; the store holds all of them.
"""
from __future__ import annotations

import contextlib
import logging
import shlex
import signal
import threading
from signal import SIGKILL, SIGUSR1, SIGUSR2
import time
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

import hostlist

from air.airctld import collector, events, goodput, history, scheduler, steps
from air.protos import squeue
from air.protos.arrays import compact as arrays_text
from air.airctld.accounting import Accounting
from air.airctld.admission import Admission
from air.protos.config import Config
from air.protos.limits import is_number
from air.airctld.fairshare import Assoc
from air.airctld.jobtable import JobTable
from air.airctld.launching import Launcher
from air.airctld.metrics import ControllerMetrics
from air.airctld.errors import Conflict, Denied, InvalidRequest, NotFound, StoreFailed
from air.airctld.model import Job, Node, evolve
from air.airctld.node_reports import CONTROLLER_UID, NodeReports
from air.airctld.passes import SchedulingPass
from air.airctld.nodes import CALL_TIMEOUT_S, NodeClients
from air.airctld.planning import Planner
from air.airctld.policy import Policy
from air.airctld.store import Store
from air.airctld.validate import MAX_TIME_LIMIT_S, check_step
from air.protos.limits import MAX_FILTER_ITEMS, MAX_NAMED_JOBS
from air.protos import air_pb2 as pb
from air.protos.credential import Identity
from air.protos.jobenv import job_variables
from air.protos.states import ACTIVE_PHASES, REASON_NAMES, JobPhase, JobResult, NodeState, Reason, long_state

log = logging.getLogger("airctld")



class Controller:
    def __init__(self, config: Config, store: Store, clock: Callable[[], float] = time.time,
                 clients: NodeClients | None = None, monotonic: Callable[[], float] = time.monotonic):
        self.config = config
        self.store = store
        self.clock = clock   # the wall clock: what is stored and shown
        # Silence (node timeout, fences, hangs) is measured with the monotonic clock: a wall clock set
        # forward must not make live nodes dead (and start a second run of their jobs beside the first)
        self.mono = monotonic
        self.clients = clients or NodeClients(config)
        self.partitions = {p.name: p for p in config.partitions}
        self.policy = Policy(config)
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._rows_lock = threading.Lock()
        self._listings_making = 0   # listings making many rows on their way (see _making_rows)
        self._actions = ThreadPoolExecutor(max_workers=16, thread_name_prefix="act")
        self._misses: dict[int, int] = {}
        self._launching: set[tuple[int, int]] = set()   # (job, run) whose launch has not returned yet
        self._unanswered: dict[int, tuple[int, str]] = {}   # job -> (run, why): its launch was never answered
        now, mono = clock(), monotonic()
        self.jobs = JobTable([self._settled(j) for j in store.load_jobs(now - config.controller.min_job_age_s)])
        # job -> its last step's number (steps are numbered on, across runs and restarts; from the store
        # the first time a job asks after a start)
        self._step_ids: dict[int, int] = {}
        stored = {n.name: n for n in store.load_nodes()}
        self.nodes: dict[str, Node] = {}
        for nc in config.nodes:
            node = stored.get(nc.name, Node(name=nc.name, address=nc.endpoint))
            # A node that was up gets a full timeout from now to be heard again.
            self.nodes[nc.name] = evolve(node, last_heartbeat=now)
        self.heard: dict[str, float] = {name: mono for name in self.nodes}   # node -> last heard (monotonic)
        self.switches = {n.name: n.switch for n in config.nodes if n.switch}
        self.features = {n.name: frozenset(n.features) for n in config.nodes if n.features}
        self.accounting = Accounting(config, store, now, self.jobs)
        self.admission = Admission(config, self.policy, self.accounting, self.features, lambda: self.nodes.keys(),
                                   self._node_sizes, self._job_exists, self.clock)
        self.planner = Planner(config)
        self._arrays: dict[int, list[int]] = {}
        for array_id in {job.array_job_id for job in self.jobs if job.array_job_id}:
            # every task, also those done long ago and not loaded: dependencies judge them all
            self._arrays[array_id] = [t.job_id for t in store.array_tasks(array_id)]
        self._warned: set[int] = set()
        self.last_progress: dict[int, float] = {}   # job -> when one of its ranks last reported
        # running job -> when it last moved (monotonic): a report, its start, or this controller's start
        self.moved: dict[int, float] = {j.job_id: mono for j in self.jobs.in_phase(JobPhase.RUNNING)}
        # airrun's running allocations -> when airrun last renewed them (monotonic): KeepAlive, their start,
        # or the first look of this controller (a restart never ends one; see _inactive)
        self.renewed: dict[int, float] = {}
        self._lease_look = mono   # when _inactive last looked
        self.rpcs_in_flight: set[int] = set()   # the RPC worker threads serving a call now (see service)
        self.airrun_renewed: dict[int, float] = {}   # as renewed, but only airrun's own renewals (and starts)
        self._no_grace: set[int] = set()   # jobs cancelled with SIGKILL: killed at once, whenever signalled
        self.latest_report: dict[int, str] = {}     # job -> rank 0's newest report (JSON)
        self.suspect: dict[str, float] = {}         # nodes a step lost, until their next heartbeat
        # job -> {node: when that node has surely fenced itself (monotonic)}: a requeued job starts again
        # only once each node of its last run has answered without a run of it, or has surely fenced itself
        self.fence_wait: dict[int, dict[str, float]] = {}
        cc = config.controller
        gone_by = mono + max(cc.fenced_by_s, CALL_TIMEOUT_S)   # (and no launch of an earlier controller is out)
        for job in [*self.jobs.schedulable(), *self.jobs.held()]:   # after a restart: a requeued job's last
            if job.restart_count:                                      # run may be alive anywhere (held too)
                self.fence_wait[job.job_id] = {n: gone_by for n in self.nodes}
        self._forgot_at = float("-inf")   # when _forget_old last looked
        self._requeued_runs: list[tuple] = []   # runs that ended in a requeue, not yet charged (accounting)
        # stopping job -> when it was asked to stop; pending preemptor -> the nodes held for it. Both are
        # written with the decisions that make them, so that a restarted controller counts the same
        self._stopped_at: dict[int, float] = {
            j: t for j, t in store.load_stop_times().items()
            if (job := self.jobs.get(j)) is not None and job.phase == JobPhase.COMPLETING}
        self._holds: dict[int, tuple[str, ...]] = store.load_holds()
        self._preempted: dict[int, set[int]] = store.load_preemptions()   # preemptor -> its victims so far
        self.metrics = ControllerMetrics(config.controller.metrics_user_labels)
        store.on_commit_time = self.metrics.commit_seconds.observe
        # (the lambdas: what tests put in their place)
        self.launcher = Launcher(self._lock, self.jobs, self.nodes, lambda: self.clients, self.clock,
                                 lambda *a: self._commit(*a), lambda *a: self._send_signal(*a), self._wake,
                                 self._stopping, self._launching, self._unanswered)
        self.reports = NodeReports(
            config, store, self.policy, self._lock, self.jobs, self.nodes, self.clock, self.mono,
            lambda: self.clients, lambda *a: self._commit(*a), lambda *a: self._send_signal(*a), self._wake,
            self._mark_dirty, heard=self.heard, suspect=self.suspect, fence_wait=self.fence_wait,
            misses=self._misses, warned=self._warned, launching=self._launching, unanswered=self._unanswered,
            last_progress=self.last_progress, moved=self.moved, latest_report=self.latest_report)
        self.passes = SchedulingPass(
            store, self._lock, self.jobs, self.nodes, self.planner, self.accounting, self.metrics, self.clock,
            self.mono, lambda *a: self._commit(*a), lambda job: self._actions.submit(self.launcher.launch, job),
            lambda *a: self._terminate(*a), partitions=self.partitions, switches=self.switches,
            features=self.features, arrays=self._arrays, fence_wait=self.fence_wait, suspect=self.suspect,
            stopped_at=self._stopped_at, holds=self._holds, preempted=self._preempted, launching=self._launching,
            warned=self._warned)

    # ------------------------------------------------------------ the loop

    def run(self, interval: float = 0.5, min_interval: float = 0.005) -> None:
        """Pass on every wake-up (a submission, an exit, a node change) or every `interval`; passes
        are at least `min_interval` apart so that a burst of submissions shares one."""
        with self._lock:
            completing = self.jobs.in_phase(JobPhase.COMPLETING)
        for job in completing:  # a stop asked before a restart
            self._send_signal(job, 0)
        try:
            self.prime()
        except Exception:   # (the first pass does it then)
            log.exception("working out priorities at start failed")
        threading.Thread(target=self._keeping_rows, name="rows", daemon=True).start()
        while not self._stopping.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            try:
                self.tick()
            except StoreFailed as e:   # rolled back whole; the next pass tries again
                log.error("controller pass failed: %s", e)
            except Exception:
                log.exception("controller pass failed")
            collector.settle()   # (after a bulk change: its full collection, here, not on a request's way)
            # a pass over a long queue takes a while: leave the CPU to requests for as long again
            self._stopping.wait(max(min_interval, self.passes.pass_seconds))

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._actions.shutdown(wait=False, cancel_futures=True)

    def tick(self) -> None:
        """One pass: node liveness, time limits, forgetting old jobs, then scheduling."""
        now = self.clock()
        self.reports.check_liveness(now)
        self._enforce_time_limits(now)
        if self.accounting.due(now):   # (every few seconds: not a copy of a long queue on every wake-up)
            with self._lock:   # usage is charged from a snapshot: requests change the table meanwhile
                jobs = [j for phase in (JobPhase.RUNNING, JobPhase.COMPLETING, JobPhase.DONE)
                        for j in self.jobs.in_phase(phase)]   # (pending jobs have used nothing)
                requeued, self._requeued_runs = self._requeued_runs, []
            try:
                self.accounting.charge(jobs, now, requeued=requeued)
            except Exception:   # (not charged: the next charge has them)
                with self._lock:
                    self._requeued_runs[:0] = requeued
                raise
        self._forget_old(now)
        self._schedule(now)

    # ------------------------------------------------------------ scheduling passes (see SchedulingPass)

    def prime(self) -> None:
        self.passes.prime()

    def _schedule(self, now: float) -> None:
        self.passes.schedule(now)

    def _dep_states(self, job_id: int) -> list[tuple[JobPhase, JobResult]]:
        return self.passes.dep_states(job_id)

    @property
    def _dirty(self) -> bool:
        """Something changed that may let a pending job start: the next pass plans (set under the lock)."""
        return self.passes.dirty

    @_dirty.setter
    def _dirty(self, value: bool) -> None:
        self.passes.dirty = value

    def _mark_dirty(self) -> None:
        self._dirty = True

    # ------------------------------------------------------------ node daemons and nodes (see NodeReports)

    def register(self, info: pb.Node) -> None:
        self.reports.register(info)

    def heartbeat(self, req: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        return self.reports.heartbeat(req)

    def node_views(self) -> list[pb.Node]:
        return self.reports.node_views()

    def update_node(self, name: str, state: NodeState, reason: str, who: Identity) -> None:
        self.reports.update_node(name, state, reason, who)

    def inject_fault(self, fault: pb.FaultRequest, who: Identity) -> None:
        self.reports.inject_fault(fault, who)

    # ------------------------------------------------------------ submit

    def submit(self, req: pb.JobRequest, who: Identity, test_only: bool = False) -> tuple[int, str]:
        job, tasks = self.admission.admit(req, who)
        if test_only:
            return 0, self._estimate(job)
        with self._lock:
            with self.store.transaction():
                if tasks is None:
                    job_id = self.store.insert_job(job, who.uid)
                    made = [evolve(job, job_id=job_id)]
                else:
                    ids = [self.store.insert_job(evolve(job, array_task_id=t), who.uid) for t in tasks]
                    job_id = ids[0]
                    self.store.set_array_job_id(ids, job_id)
                    made = [evolve(job, job_id=i, array_job_id=job_id, array_task_id=t) for i, t in zip(ids, tasks)]
                    self.store.after_commit(lambda: self._arrays.__setitem__(job_id, ids))
            for j in made:
                self.jobs.put(j)
            self._dirty = True
        self.metrics.submitted(made)
        self._wake.set()
        return job_id, ""

    def _node_sizes(self) -> dict[str, tuple[int, int]]:
        """Each node's (GPUs, CPUs), of the nodes whose daemons have said what they have."""
        with self._lock:
            return {n.name: (len(n.gpus), n.cpus) for n in self.nodes.values() if n.cpus}

    def _job_exists(self, job_id: int) -> bool:
        return job_id in self.jobs or job_id in self._arrays or self.store.get_job(job_id) is not None

    def _estimate(self, job: Job) -> str:
        with self._lock:
            active = self.jobs.active()
            free = scheduler.free_resources(self.nodes.values(), active, self.switches, features=self.features)
            pending = self.jobs.in_phase(JobPhase.PENDING)
        probe = evolve(job, job_id=-1, priority=job.priority)
        plan = scheduler.schedule(pending + [probe], free, self.partitions, active=active, now=self.clock())
        for job_id, alloc in plan.starts:
            if job_id == -1:
                return f"would start now on {','.join(a.node for a in alloc)} in partition {job.partition}"
        return f"would wait in partition {job.partition}: {plan.waiting[-1].name}"

    # ------------------------------------------------------------ cancel and signal

    def cancel(self, filt: pb.JobFilter, signal: int, who: Identity, batch_only: bool = False,
               steps_only: bool = False, release: int = 0) -> list[int]:
        """Cancel jobs (signal 0, or SIGKILL to the whole job: at once, as Slurm's), or signal the
        running ones; `release`: airrun gives its own allocation back (see CancelRequest.release)."""
        if not 0 <= signal <= 64 or release not in (0, 1, 2):
            raise InvalidRequest(f"signal {signal}: 1 to 64 (0: cancel)" if release in (0, 1, 2) else
                                 f"release {release}: 1 (the step succeeded) or 2 (it failed)")
        if release:
            return self._release(filt, who, release == 1)
        kill = signal == SIGKILL and not batch_only and not steps_only
        ending: list[Job] = []       # with SIGKILL: jobs already in their grace time, killed now
        requeuing: list[Job] = []    # jobs stopping to go back to the queue: they end CANCELLED instead
        with self._lock:
            if signal and not kill:
                targets = self._select(filt, who, acting=True)
            else:
                selected = self._select(filt, who, acting=True, every_phase=True)
                targets = [j for j in selected if j.phase in (JobPhase.PENDING, JobPhase.RUNNING)]
                stopping = [j for j in selected if j.phase == JobPhase.COMPLETING]
                requeuing = [j for j in stopping if j.reason in events.REQUEUING and j.requeue_allowed]
                ending = stopping if kill else []
                if len(selected) == 1 and len(filt.job_ids) + len(filt.array_tasks) == 1 and \
                        not (targets or requeuing or ending):
                    raise Conflict(f"job {selected[0].job_id} is "
                                   f"{long_state(selected[0].phase, selected[0].result).lower()}; cannot cancel it")
            if signal and not kill:
                targets = [j for j in targets if j.phase == JobPhase.RUNNING]
                for job in targets:   # (an allocation's shell is airctld's: a signal is for its steps)
                    self._send_signal(job, signal, batch_only=batch_only and not job.request.allocation,
                                      steps_only=steps_only and not batch_only or job.request.allocation)
                return [j.job_id for j in targets]
            now = self.clock()
            why = f"cancelled by uid {who.uid}"
            with collector.paused(len(targets)):
                alike, ended = events.stop_pending([j for j in targets if j.phase == JobPhase.PENDING], now,
                                                   JobResult.CANCELLED, Reason.CANCELLED, why)
                others = [(j, events.stop(j, now, JobResult.CANCELLED, Reason.CANCELLED, why))
                          for j in targets if j.phase != JobPhase.PENDING] + \
                         [(j, events.cancelled_while_stopping(j, why)) for j in requeuing]
                # pending jobs in one bulk write; with others, in one transaction (none: none begun)
                with self.store.transaction() if ended and others else contextlib.nullcontext():
                    changed = self._commit(ended, now, who.uid, alike) + self._commit(others, now, who.uid)
            if ended and others:   # (in the order asked, as before the bulk write)
                place = {j.job_id: n for n, j in enumerate(targets)}
                changed.sort(key=lambda j: place.get(j.job_id, len(place)))
            stopped = {j.job_id for j in requeuing}   # (already signalled: their grace time goes on)
            if kill:   # (also when signalled later: after its launch returns, or stopped again)
                self._no_grace.update(j.job_id for j in [*changed, *ending] if j.phase == JobPhase.COMPLETING)
            ending = [self.jobs.get(j.job_id) or j for j in ending]
            launching = set(self._launching)
        self._terminate([j for j in changed if j.job_id not in stopped] + ending, launching)
        self._wake.set()
        return list(dict.fromkeys([j.job_id for j in changed] + [j.job_id for j in ending]))

    def _release(self, filt: pb.JobFilter, who: Identity, succeeded: bool) -> list[int]:
        """The allocation's shell ends as airrun's step did (SIGUSR1: COMPLETED, SIGUSR2: FAILED, by its
        traps), which only airctld signals."""
        with self._lock:
            targets = self._allocations(filt, who)
            for job in targets:
                self._send_signal(job, SIGUSR1 if succeeded else SIGUSR2, batch_only=True)
        return [j.job_id for j in targets]

    def _allocations(self, filt: pb.JobFilter, who: Identity) -> list[Job]:
        """airrun's own running allocations among the jobs named (under the lock)."""
        return [j for j in self._select(filt, who, acting=True) if j.phase == JobPhase.RUNNING and j.request.allocation]

    def keep_alive(self, filt: pb.JobFilter, who: Identity) -> list[int]:
        """airrun renews its own allocations (see ControllerConfig.inactive_limit_s)."""
        if not filt.job_ids or len(filt.job_ids) > 64 or filt.array_tasks:
            raise InvalidRequest("name the allocations to renew (1 to 64 job ids)")
        with self._lock:
            targets = self._allocations(filt, who)
            mono = self.mono()
            for job in targets:
                self.renewed[job.job_id] = self.airrun_renewed[job.job_id] = mono
        return [j.job_id for j in targets]

    def requeue(self, filt: pb.JobFilter, who: Identity) -> list[int]:
        """Running jobs stop cleanly (SIGTERM, then the grace time to checkpoint) and go back to the queue."""
        with self._lock:
            selected = self._select(filt, who, acting=True, doing="requeue")
            running = [j for j in selected if j.phase == JobPhase.RUNNING]
            if len(filt.job_ids) + len(filt.array_tasks) == 1 and selected and not running:
                raise Conflict(f"job {selected[0].job_id} is not running; only running jobs can be requeued")
            refused = [j for j in running if not j.requeue_allowed]
            if refused:
                raise Conflict(f"job {refused[0].job_id} was submitted with --no-requeue")
            now = self.clock()
            changed = self._commit([(j, events.stop(j, now, JobResult.NONE, Reason.REQUEUE_REQUESTED,
                                                    f"requeue asked by uid {who.uid}")) for j in running], now, who.uid)
            launching = set(self._launching)
        self._terminate(changed, launching)
        return [j.job_id for j in changed]

    def update_time_limit(self, filt: pb.JobFilter, seconds: int, change: int, who: Identity) -> list[int]:
        """A new time limit for pending and running jobs (0: none), or one `seconds` longer (change 1)
        or shorter (-1). Owners may lower a limit; only root and operators may raise one or take it
        away, as in Slurm. A running job past its new limit times out at the controller's next tick."""
        if change not in (-1, 0, 1) or seconds > MAX_TIME_LIMIT_S or (change and not seconds):
            raise InvalidRequest(f"time limit change {change:+d} of {seconds} s: not a time limit")
        if not filt.job_ids and not filt.array_tasks:
            raise InvalidRequest("name the jobs to update (JobId=N)")
        with self._lock:
            selected = self._select(filt, who, acting=True, doing="update")
            targets = [j for j in selected if j.phase in (JobPhase.PENDING, JobPhase.RUNNING)]
            if len(filt.job_ids) + len(filt.array_tasks) == 1 and selected and not targets:
                raise Conflict(f"job {selected[0].job_id} is {long_state(selected[0].phase, selected[0].result)}; "
                               "only pending and running jobs take a new time limit")
            changes = []
            for j in targets:
                if change and not j.time_limit_s:
                    raise Conflict(f"job {j.job_id} has no time limit to change by {seconds} s; give TimeLimit=T")
                new = seconds if not change else j.time_limit_s + change * seconds
                if new <= 0 and change:
                    raise InvalidRequest(f"job {j.job_id}: its time limit of {j.time_limit_s} s less {seconds} s "
                                         "leaves none")
                if new > MAX_TIME_LIMIT_S:
                    raise InvalidRequest(f"job {j.job_id}: a time limit of {new} s; at most {MAX_TIME_LIMIT_S} s")
                raising = new == 0 and j.time_limit_s != 0 or new > j.time_limit_s != 0
                if raising and not self.policy.is_operator(who):
                    raise Denied(f"job {j.job_id}: only root and operators may raise a time limit "
                                 f"({j.time_limit_s} s now); you may lower it")
                if new != j.time_limit_s:
                    changes.append((j, evolve(j, time_limit_s=new)))
            changed = self._commit(changes, self.clock(), who.uid)
            if changed:
                self._dirty = True   # reservations and backfill rest on time limits
            for j in changed:   # a --signal warning comes again before the new limit
                self._warned.discard(j.job_id)
        self._wake.set()
        return [j.job_id for j in changed]

    def _terminate(self, changed: list[Job], launching: set[tuple[int, int]]) -> None:
        """Terminate the jobs just set COMPLETING; one still being launched is signalled once its
        launch returns (see Launcher.launch)."""
        for job in changed:
            if job.phase == JobPhase.COMPLETING and (job.job_id, job.restart_count) not in launching:
                self._send_signal(job, 0)

    def hold(self, filt: pb.JobFilter, hold: bool, who: Identity) -> list[int]:
        with self._lock:
            selected = self._select(filt, who, acting=True, doing="hold or release")
            targets = [j for j in selected if j.phase == JobPhase.PENDING and j.hold != hold]
            if len(filt.job_ids) == 1 and selected and selected[0].phase != JobPhase.PENDING:
                events.held(selected[0], hold)  # raises TransitionError: not pending
            now = self.clock()
            with collector.paused(len(targets)):
                changed = self._commit([(j, events.held(j, hold)) for j in targets], now, who.uid)
            if not changed:   # nothing to do: the pass in flight stands
                return []
            self._dirty = True
            if not hold:   # a released job may rank above jobs the pass in flight starts
                self.passes.released += [j.priority for j in changed]
        self._wake.set()
        return [j.job_id for j in changed]

    def _select(self, filt: pb.JobFilter, who: Identity, acting: bool,
                doing: str = "cancel or signal", every_phase: bool = False) -> list[Job]:
        wanted = _wanted(filt)   # (bounded: the caller holds the controller's lock)
        if filt.job_ids or filt.array_tasks:
            named = list(dict.fromkeys(filt.job_ids))
            arrays = list(dict.fromkeys([t.array_job_id for t in filt.array_tasks]))
            size = sum(len(self._arrays.get(i, (i,))) for i in named) + \
                sum(len(self._arrays.get(a, ())) for a in arrays)
            if size > MAX_NAMED_JOBS:
                raise InvalidRequest(f"the jobs named stand for {size} jobs (array tasks counted); at most "
                                     f"{MAX_NAMED_JOBS} in one request: name fewer")
            ids = [i for n in named for i in self._arrays.get(n, (n,))] + \
                [i for a in arrays for i in self._arrays.get(a, ())]
            older = [i for i in ids if i not in self.jobs]   # jobs that ended long ago, in the store only
            skim = acting and len(named) + len(filt.array_tasks) > 1
            if skim:
                # nothing acts on an ended job: of these, only whether a named one exists matters
                stored = {}
                exists = self.store.existing_ids([i for i in named if i in older and i not in self._arrays])
                missing = [i for i in named if i not in self.jobs and i not in self._arrays and i not in exists]
            else:   # a listing shows them; a job named alone is answered with its state
                stored = self.store.get_jobs(older)   # one read for all (bounded above)
                for job in stored.values():
                    self._settled(job)
                missing = [i for i in named if i not in self.jobs and i not in stored and i not in self._arrays]
            if missing:
                raise NotFound(f"job {missing[0]} does not exist")
            found = {i: j for i in ids if (j := self.jobs.get(i) or stored.get(i)) is not None}
            ids = [i for n in named for i in self._arrays.get(n, (n,)) if i in found]
            by_index: dict[tuple[int, int], list[int]] = {}   # (array, task index) -> job ids
            for a in arrays:
                for i in self._arrays.get(a, ()):
                    if i in found:
                        by_index.setdefault((a, found[i].array_task_id), []).append(i)
            for t in filt.array_tasks:
                tasks = by_index.get((t.array_job_id, t.task_id))
                if not tasks and not (skim and t.array_job_id in self._arrays):   # (skim: an ended task, maybe)
                    raise NotFound(f"job {t.array_job_id}_{t.task_id} does not exist")
                ids.extend(tasks or ())
            candidates = [found[i] for i in dict.fromkeys(ids)]   # (retention may have removed some tasks)
        else:
            candidates = list(self.jobs)
        selected = [j for j in candidates if _matches(j, wanted)] if wanted.any else candidates
        if not acting:
            if not self.policy.sees_all(who):
                selected = [j for j in selected if j.uid == who.uid]
            return selected
        for job in selected:
            self.policy.check_may_act(who, job, doing)
        if doing != "cancel or signal" or every_phase:
            return selected
        if len(selected) == 1 and len(filt.job_ids) + len(filt.array_tasks) == 1 and \
                selected[0].phase not in (JobPhase.PENDING, JobPhase.RUNNING):
            job = selected[0]
            raise Conflict(f"job {job.job_id} is {long_state(job.phase, job.result).lower()}; cannot cancel it")
        return [j for j in selected if j.phase in (JobPhase.PENDING, JobPhase.RUNNING)]

    def _send_signal(self, job: Job, signal: int, grace: float | None = None, batch_only: bool = False,
                     steps_only: bool = False) -> None:
        """To every node of the job: the batch script and any step ranks there (or the batch shell only,
        or the steps' ranks only)."""
        if grace is None:
            grace = 0.0 if job.job_id in self._no_grace else self.config.scheduler.preempt_grace_s \
                if job.reason == Reason.PREEMPTED else self.config.controller.kill_wait_s
        nodes = job.node_names[:1] if batch_only else job.node_names
        why = REASON_NAMES[Reason(job.reason)] if signal == 0 else ("TimeLimit" if job.job_id in self._warned else "")
        for node in nodes:
            if self.nodes[node].state in (NodeState.UP, NodeState.DRAIN):
                self._actions.submit(self._deliver_signal, node, job.job_id, job.restart_count, signal, grace,
                                     batch_only, why, steps_only)

    def _deliver_signal(self, node: str, job_id: int, run: int, signal: int, grace: float, batch_only: bool = False,
                        why: str = "", steps_only: bool = False) -> None:
        """To one node, for one run of the job: a node never applies it to a newer run."""
        try:
            self.clients.signal(self.nodes[node].address, job_id, run, signal, grace, batch_only, why, steps_only)
        except Exception as e:  # the node's liveness check ends the job if the node is gone
            log.warning("could not signal job %d on %s: %s", job_id, node, e)

    # ------------------------------------------------------------ steps (airrun)

    def end_step(self, end: pb.StepEnd, who: Identity) -> bool:
        """airrun's word that a step of the job ended, with its exit code: kept once, from the job's
        owner (or root), for a step of the run named. The job itself may have ended meanwhile."""
        if not 0 <= end.exit_code <= 255 or not 0 <= end.exit_signal <= 127 or end.job_id >= 1 << 62:
            raise InvalidRequest(f"step end {end.job_id}.{end.step_id}: exit code 0 to 255, signal 0 to 127")
        with self._lock:
            job = self.jobs.get(end.job_id) or self.store.get_job(end.job_id)
            if job is None:
                raise NotFound(f"job {end.job_id} does not exist")
            if job.uid != who.uid and not who.is_root:
                raise Denied(f"job {job.job_id} belongs to {job.user}; only its owner may end its steps")
            with self.store.transaction():
                return self.store.end_step(end.job_id, end.run, end.step_id, self.clock(), end.exit_code,
                                           end.exit_signal, end.cancelled)

    def create_step(self, spec: pb.StepSpec, who: Identity) -> pb.Step:
        """Lay out a step of a running job and have every node of it ready its ranks."""
        with self._lock:
            job = self.jobs.get(spec.job_id)
            if job is None:
                raise NotFound(f"job {spec.job_id} does not exist or is not running")
            if job.uid != who.uid and not who.is_root:
                raise Denied(f"job {job.job_id} belongs to {job.user}; only its owner may start steps in it")
            if job.phase != JobPhase.RUNNING:
                raise Conflict(f"job {job.job_id} is {long_state(job.phase, job.result).lower()}; "
                               "steps run only in running jobs")
            addresses = {a.node: self.nodes[a.node].address for a in job.allocation}
            check_step(spec, self.config.controller, len(job.allocation))
            caller_run = spec.environment.get("AIR_RESTART_COUNT", "")
            if is_number(caller_run) and int(caller_run) != job.restart_count:
                raise Conflict(f"airrun of run {caller_run} of job {job.job_id}, which is on run "
                               f"{job.restart_count} now: a stale run starts no step")
            nodes, world = steps.layout(job, spec, addresses)
            if job.job_id not in self._step_ids:
                self._step_ids[job.job_id] = self.store.last_step_id(job.job_id)
            step_id = self._step_ids[job.job_id] + 1
            if step_id >= self.config.controller.max_steps_per_job:   # each is a row kept with the job
                raise Conflict(f"job {job.job_id} has started {step_id} steps, its limit "
                               f"(max_steps_per_job = {self.config.controller.max_steps_per_job})")
            with self.store.transaction():   # numbered once, for good, before any node hears of it
                self.store.add_step(job.job_id, step_id, job.restart_count, self.clock(),
                                    hostlist.collect_hostlist([n.node for n in nodes]), world,
                                    shlex.join(spec.argv)[:1024])
            self._step_ids[job.job_id] = step_id
        # (outside the lock: `job` is the version the step was numbered for, and its request may be MiBs)
        variables = job_variables(job.to_proto(), self.config.controller.cluster_name)
        step = pb.Step(job_id=job.job_id, step_id=step_id, run=job.restart_count, uid=job.uid, gid=job.gid,
                       world_size=world,
                       master_addr=nodes[0].address.rsplit(":", 1)[0], nodes=nodes, spec=spec,
                       job_environment=variables)
        first = self.clients.prepare_step(nodes[0].address, step)
        step.master_port = first.free_port
        for node in nodes:  # every node gets the final step, the first one again with its port
            self.clients.prepare_step(node.address, step)
        return step

    # ------------------------------------------------------------ queries

    def list_jobs(self, filt: pb.JobFilter, who: Identity) -> list[bytes]:
        """Jobs matching the filter, each as an encoded brief Job (no script, no environment)."""
        with self._lock:
            out = []
            for job in self._listed(filt, who, self.clock()):
                brief = self.jobs.brief(job, _brief)
                if filt.with_progress and job.job_id in self.latest_report:
                    brief += self._progress_fields(job.job_id)   # fields appended merge into the message
                out.append(brief)
            return out

    def _listed(self, filt: pb.JobFilter, who: Identity, now: float) -> list[Job]:
        """What a listing shows (under the lock): the jobs `who` may see, but those that ended before the
        visibility window unless asked for (include_old, or by id)."""
        jobs = self._select(filt, who, acting=False)
        if filt.include_old or filt.job_ids:
            return jobs
        horizon = now - self.config.controller.min_job_age_s
        return [j for j in jobs if j.phase != JobPhase.DONE or j.end_time >= horizon]

    def list_rows(self, filt: pb.JobFilter, who: Identity) -> str:
        """The jobs `list_jobs` would give, as squeue's default format shows them (plain airq): one line
        each, no header, an array's pending tasks in one row unless filt.expand_arrays. A pending or
        ended job's row is kept until the job changes; a running job's (its TIME moves) is made anew."""
        now = self.clock()
        with self._lock:
            if _unfiltered(filt) and self.policy.sees_all(who):   # (what every plain airq asks)
                plain, jobs, rows = self.jobs.listing(now - self.config.controller.min_job_age_s)
            else:
                jobs = self._listed(filt, who, now)
                plain, rows = [None] * len(jobs), self.jobs.rows(jobs)
        if not jobs:   # (only plain pending jobs: their rows as they are)
            return "\n".join([*plain, ""]) if plain else ""
        items = squeue.compile_format(squeue.SQUEUE_DEFAULT, squeue.job_fields(now))
        lines: list = []
        made: list[tuple[Job, str]] = []
        arrays: dict[int, tuple[int, list[Job]]] = {}   # array -> (its row's place, its pending tasks)
        expand, pending, append = filt.expand_arrays, JobPhase.PENDING, lines.append
        others = zip(jobs, rows)
        with self._making_rows(sum(row is None and _kept(job, expand) for job, row in zip(jobs, rows))):
            for row in plain:   # (outside the lock: a row is made from the version of the job picked)
                if row is not None:
                    append(row)
                    continue
                job, row = next(others)
                if job is None:   # (ended before the listing's horizon)
                    continue
                if job.array_job_id and not expand and job.phase == pending:
                    arrays.setdefault(job.array_job_id, (len(lines), []))[1].append(job)
                    if len(arrays[job.array_job_id][1]) == 1:
                        lines.append("")
                    continue
                if row is None:
                    row = _row(items, job)
                    if _kept(job, expand):
                        made.append((job, row))
                append(row)
        if made:
            with self._lock:   # (the table changes only under it: a job changed or forgotten meanwhile
                for job, row in made:   # keeps no row)
                    self.jobs.keep_row(job, row)
        for place, tasks in arrays.values():
            first = pb.Job.FromString(_brief(tasks[0]))
            first.array_pending_tasks = arrays_text([t.array_task_id for t in tasks])
            first.array_tasks_pending = len(tasks)
            lines[place] = squeue.render(items, [first], header=False)[0]
        if lines:
            lines.append("")   # (the last row's newline)
        return "\n".join(lines)

    @contextlib.contextmanager
    def _making_rows(self, count: int):
        """A listing about to make `count` rows on its way: keep_rows waits meanwhile, if many (it
        would make the same rows again: an airq right after a cancel of 100,000 jobs took twice as
        long)."""
        many = count > MANY_ROWS
        if many:
            with self._rows_lock:
                self._listings_making += 1
        try:
            yield
        finally:
            if many:
                with self._rows_lock:
                    self._listings_making -= 1

    def keep_rows(self, limit: int | None = None) -> int:
        """Make up to `limit` (ROWS_BATCH) of the rows list_rows keeps (pending and ended jobs'), ahead of the
        listing that would make them on its way: after 100,000 submissions, or a pass that gave them
        all a reason, the first plain airq made every row (2 s). How many jobs it took (0: none waiting)."""
        if self._listings_making:
            return 0
        with self._lock:
            jobs = self.jobs.unrendered(ROWS_BATCH if limit is None else limit)
        if not jobs:
            return 0
        items = squeue.compile_format(squeue.SQUEUE_DEFAULT, squeue.job_fields(self.clock()))
        made, failed = [], []
        began = time.perf_counter()
        for job in jobs:   # (outside the lock, as a listing's: the row is tied to this version of the job)
            if time.perf_counter() - began > 0.05:   # (a row of a job with a script of megabytes takes 1 ms)
                break
            try:
                made.append((job, _row(items, job)))
            except Exception:
                log.exception("job %d: its row for airq was not made", job.job_id)
                failed.append(job)
        with self._lock:
            for job, row in made:
                self.jobs.keep_row(job, row)
            for job in failed:
                self.jobs.not_rendered(job)
        return len(made) + len(failed)

    def _keeping_rows(self) -> None:
        """keep_rows until the controller stops. While rows wait by the batch (after a flood of
        submissions), a batch (at most 50 ms), then a pause as long, that leaves the interpreter to
        requests and passes; once caught up, a look every 0.1 s: a job of a burst that starts and ends
        within it gets one row made, its last (a listing makes any row still missing on its way)."""
        while not self._stopping.is_set():
            began = time.perf_counter()
            try:
                made = self.keep_rows()
            except Exception:
                log.exception("airq's rows were not made")
                made = 0
            took = time.perf_counter() - began
            self._stopping.wait(max(0.005, took) if made >= ROWS_BATCH or took >= 0.05 else 0.1)

    def _settled(self, job: Job | None) -> Job | None:
        """A job read from the store, with the QOS it ran under: jobs stored before the QOS was recorded
        at submit have none, and ran under the default (history settles it in its own reads)."""
        if job is not None and not job.request.qos:
            job.request.qos = self.config.scheduler.default_qos
        return job

    def _progress_fields(self, job_id: int) -> bytes:
        return pb.Job(progress=self.latest_report.get(job_id, ""),
                      last_progress=self.last_progress.get(job_id, 0.0)).SerializeToString()

    def job_reports(self, job_id: int, who: Identity) -> list[str]:
        self.get_job(job_id, who)   # exists, and the caller may see it
        return self.store.reports(job_id)

    def get_job(self, job_id: int, who: Identity) -> Job:
        with self._lock:
            job = self.jobs.get(job_id)
        job = job or self._settled(self.store.get_job(job_id))
        if job is None:
            raise NotFound(f"job {job_id} does not exist")
        if job.uid != who.uid and not self.policy.sees_all(who):
            raise Denied(f"job {job_id} belongs to another user; this cluster keeps jobs private")
        return job

    def job_view(self, job_id: int, who: Identity) -> pb.Job:
        """A job as `who` may see it: its script, environment and arguments go only to its owner, root
        and operators, whatever private_jobs says (output paths and names stay visible, as in Slurm)."""
        job = self.get_job(job_id, who)
        view = job.to_proto()
        if job.uid != who.uid and not self.policy.is_operator(who):
            _strip_private(view)
        view.progress = self.latest_report.get(job_id, "")
        view.last_progress = self.last_progress.get(job_id, 0.0)
        with self.store.reader() as conn:
            runs, _, _ = history.details(conn, [job_id], with_steps=False)
        view.goodput.CopyFrom(goodput.job_goodput(view, runs.get(job_id, ()), view.progress, self.clock()))
        return view

    def history(self, req: pb.HistoryRequest, who: Identity) -> pb.HistoryReply:
        """airacct: jobs from the store, one page at a time. A user sees their own jobs unless they ask
        for others' (-u, -a, or job ids) and this cluster does not keep jobs private; root and operators
        see everyone's by default. Never a script or environment; arguments, the submit line and step
        commands only to a job's owner, root and operators."""
        operator = self.policy.is_operator(who)
        ask = pb.HistoryRequest()
        ask.CopyFrom(req)
        if not self.policy.sees_all(who):
            if req.uids and who.uid not in req.uids:
                return pb.HistoryReply()
            ask.ClearField("uids")
            ask.uids.append(who.uid)
        elif not (req.uids or req.all_users or req.job_ids or req.array_tasks or operator):
            ask.uids.append(who.uid)
        default_qos = self.config.scheduler.default_qos
        if default_qos in ask.qos:   # jobs from before the QOS was recorded at submit have none
            ask.qos.append("")
        page, budget = self.config.controller.history_page_jobs, self.config.controller.max_message_bytes // 2
        try:
            jobs, more = self.store.history(ask, min(req.max_jobs or page, page), budget)
        except history.TooMuch as e:
            raise InvalidRequest(str(e)) from None
        now = self.clock()
        for entry in jobs:   # (goodput adds a few dozen bytes a job to the store's page budget)
            entry.job.request.qos = entry.job.request.qos or default_qos
            entry.job.goodput.CopyFrom(goodput.job_goodput(entry.job, entry.runs,
                                                           self.latest_report.get(entry.job.job_id, ""), now))
            if entry.job.uid != who.uid and not operator:
                _strip_private(entry.job)
                for step in entry.steps:
                    step.ClearField("command")
        return pb.HistoryReply(jobs=jobs, truncated=more)

    def pending_views(self, filt: pb.JobFilter, who: Identity) -> list[pb.PendingJob]:
        """airq --priority and --start: each pending job's factors and the last pass's estimate."""
        now = self.clock()
        with self._lock:
            jobs = [j for j in self._select(filt, who, acting=False) if j.phase == JobPhase.PENDING]
        return self.planner.views(jobs, now)

    def share_rows(self, req: pb.SharesRequest) -> list[pb.ShareRow]:
        with self._lock:
            jobs = self.jobs.schedulable() + self.jobs.active()
            active = self.jobs.active()
        return self.accounting.rows(jobs, active, req.accounts, req.users)

    def update_account(self, req: pb.AccountRequest, who: Identity) -> None:
        if not self.policy.is_operator(who):
            raise Denied("only root and operators may change accounts")
        a = req.assoc
        assoc = Assoc(a.account, a.user, a.parent or "root", a.shares, a.max_gpus)
        with self._lock:
            if req.op == pb.ACCOUNT_OP_ADD:
                self.accounting.add(assoc)
            elif req.op == pb.ACCOUNT_OP_MODIFY:
                self.accounting.modify(assoc, req.set_fields)
            elif req.op == pb.ACCOUNT_OP_REMOVE:
                self.accounting.remove(a.account, a.user)
            else:
                raise InvalidRequest("give an operation: add, modify or remove")
            self._dirty = True
            self.passes.epoch += 1
        self._wake.set()

    # ------------------------------------------------------------ passes

    def _commit(self, changes: Iterable[tuple[Job, Job]], now: float, who: int,
                alike: dict | None = None) -> list[Job]:
        """Write (old, new) job pairs in one transaction, and take them into memory once it (or the one
        it is part of) has committed: a transaction that fails leaves memory as it was. A run that
        ends keeps its runtime's figures (goodput), from its latest report. `alike`: see
        Store.update_jobs (no run ends in such a change: pending jobs only)."""
        changes = list(changes)
        if not changes:
            return []
        with collector.paused(len(changes)):
            return self._write(changes, now, who, alike)

    def _write(self, changes: list[tuple[Job, Job]], now: float, who: int, alike: dict | None) -> list[Job]:
        if alike is None:
            changes = [(old, self._with_figures(old, new)) for old, new in changes]
        with self.store.transaction():
            self.store.update_jobs(changes, now, who, alike)
            # a stop's time is kept from the first time it was asked until the job leaves COMPLETING
            self.store.add_stop_times((new.job_id, now) for _, new in changes if new.phase == JobPhase.COMPLETING)
            self.store.remove_stop_times(new.job_id for old, new in changes
                                         if old.phase == JobPhase.COMPLETING and new.phase != JobPhase.COMPLETING)
            self.store.after_commit(lambda: self._take(changes, now))
        return [new for _, new in changes]

    def _with_figures(self, old: Job, new: Job) -> Job:
        if not goodput.run_ended(old, new):
            return new
        try:   # (after a controller restart, before the run's next report: the newest one stored)
            report = self.latest_report.get(old.job_id) or self.store.last_report(old.job_id)
            return evolve(new, figures=goodput.live_figures(report, old.restart_count))
        except Exception:   # figures are a job's own words: they never keep its state change from the store
            log.exception("job %d: the run's goodput figures were not kept", old.job_id)
            return evolve(new, figures="")

    def _take(self, changes: list[tuple[Job, Job]], now: float) -> None:
        cc = self.config.controller
        put, moved, renewed, airrun_renewed = self.jobs.put, self.moved, self.renewed, self.airrun_renewed
        stopped_at, no_grace, misses, step_ids = self._stopped_at, self._no_grace, self._misses, self._step_ids
        pending, running, completing, done = JobPhase.PENDING, JobPhase.RUNNING, JobPhase.COMPLETING, JobPhase.DONE
        for old, new in changes:   # (in locals: a bulk change takes 100,000 jobs in)
            put(new)
            job_id, phase, was = new.job_id, new.phase, old.phase
            if phase == pending and was in ACTIVE_PHASES:   # requeued: wait for the old run
                if old.start_time:   # its usage: the job forgets the run's times, the next charge needs them
                    self._requeued_runs.append(self.accounting.ended_run(old, now))
                mono = self.mono()
                self.fence_wait[job_id] = {
                    n: self.heard.get(n, mono) + cc.fenced_by_s
                    for n in old.node_names if n in self.nodes}
            if phase == running:
                if was != running:
                    moved[job_id] = self.mono()
                    if new.request.allocation:
                        renewed[job_id] = airrun_renewed[job_id] = self.mono()
            else:
                moved.pop(job_id, None)
                renewed.pop(job_id, None)
                airrun_renewed.pop(job_id, None)
            if phase == done:
                step_ids.pop(job_id, None)
            if phase == completing:
                stopped_at.setdefault(job_id, now)
            else:
                stopped_at.pop(job_id, None)
                no_grace.discard(job_id)
                if phase != was:
                    misses.pop(job_id, None)
                    self._dirty = True  # resources freed, a job that others waited behind gone, or one requeued
        try:   # last: a metric never keeps the controller from taking a change in
            self.metrics.changed(changes, now)
        except Exception:
            log.exception("metrics not updated for %d job changes", len(changes))

    def _enforce_time_limits(self, now: float) -> None:
        with self._lock:
            mono = self.mono()
            running = self.jobs.in_phase(JobPhase.RUNNING)
            warn = [j for j in running if j.request.warn_signal and j.time_limit_s and j.job_id not in self._warned
                    and now >= j.start_time + j.time_limit_s - j.request.warn_time_s]
            over = [j for j in running if j.time_limit_s and now - j.start_time > j.time_limit_s]
            silent = [j for j in running if j.request.hang_timeout_s and j not in over and
                      mono - self.moved.get(j.job_id, mono) > j.request.hang_timeout_s]
            inactive = self._inactive(running, over + silent, mono)
            # all or none, and then the signals (a pass with nothing to stop opens no transaction)
            with self.store.transaction() if silent or over or inactive else contextlib.nullcontext():
                hung = self._commit([(j, events.hung(j, now, mono - self.moved.get(j.job_id, mono)))
                                     for j in silent], now, CONTROLLER_UID)
                changed = self._commit([(j, events.stop(j, now, JobResult.TIMEOUT, Reason.TIME_LIMIT,
                                                        "time limit reached")) for j in over], now, CONTROLLER_UID)
                changed += self._commit([(j, events.stop(
                    j, now, JobResult.TIMEOUT, Reason.INACTIVE_LIMIT,
                    f"airrun did not renew its allocation for {mono - self.renewed[j.job_id]:.0f} s "
                    "(killed, stopped or cut off)")) for j in inactive], now, CONTROLLER_UID)
        for job in warn:   # --signal: the warning before the limit, once a run
            self._warned.add(job.job_id)
            self._send_signal(job, job.request.warn_signal, batch_only=job.request.warn_batch_only,
                              steps_only=job.request.warn_steps_only)
        for job in changed:
            self._send_signal(job, 0)
        for job in hung:   # stacks first (faulthandler on SIGUSR2 in the runtime), then the stop
            log.warning("job %d hung: %s", job.job_id, job.reason_detail)
            self._actions.submit(self._dump_then_stop, job)

    def _inactive(self, running: list[Job], ending_now: list[Job], mono: float) -> list[Job]:
        """airrun's allocations it has not renewed for inactive_limit_s (Slurm's InactiveLimit)."""
        limit = self.config.controller.inactive_limit_s
        if not limit:
            return []
        if mono - self._lease_look > limit / 3:   # this controller was frozen or starved meanwhile: the
            for job_id in self.renewed:              # renewals it did not take were not airrun's fault
                self.renewed[job_id] = mono
        elif len(self.rpcs_in_flight) >= RPC_WORKERS:
            # every RPC worker is busy: renewals may wait for one. Excused for a while after airrun's
            # last renewal that arrived (callers that keep the workers busy keep no dead allocation)
            cap = SATURATION_CREDIT * limit
            for job_id, renewed in self.renewed.items():
                self.renewed[job_id] = max(renewed, min(mono, self.airrun_renewed.setdefault(job_id, mono) + cap))
        self._lease_look = mono
        ending = {j.job_id for j in ending_now}
        return [j for j in running if j.request.allocation and j.job_id not in ending
                and mono - self.renewed.setdefault(j.job_id, mono) > limit]

    def _dump_then_stop(self, job: Job) -> None:
        for node in job.node_names:
            self._deliver_signal(node, job.job_id, job.restart_count, signal.SIGUSR2, 0.0)
        time.sleep(1.0)
        self._send_signal(job, 0)

    def _forget_old(self, now: float) -> None:
        """Drop from memory the jobs that ended before the visibility window (they stay in the store).
        A look over every ended job: once a second at most, not on every wake-up."""
        if 0 <= now - self._forgot_at < FORGET_EVERY_S:
            return
        self._forgot_at = now
        horizon = now - self.config.controller.min_job_age_s
        with self._lock:
            for job in self.jobs.in_phase(JobPhase.DONE):
                if job.end_time < horizon:
                    self.jobs.remove(job.job_id)
                    self.planner.forget(job.job_id)
                    self._warned.discard(job.job_id)
                    self.last_progress.pop(job.job_id, None)
                    self.latest_report.pop(job.job_id, None)


FORGET_EVERY_S = 1.0   # how often ended jobs past the visibility window are dropped from memory
RPC_WORKERS = 16   # the threads that serve RPCs (airctld's gRPC server)
MANY_ROWS = 500   # a listing that makes more rows than this on its way holds keep_rows back
ROWS_BATCH = 500   # rows keep_rows makes at most in one go (the default)
SATURATION_CREDIT = 5   # inactive limits of busy RPC workers that airrun's renewals are excused for


@dataclass(frozen=True)
class _Wanted:
    """A job filter's lists as sets (None: any), made once per request."""
    uids: frozenset | None
    phases: frozenset | None
    results: frozenset | None
    names: frozenset | None
    partitions: frozenset | None

    @property
    def any(self) -> bool:
        return any(x is not None for x in (self.uids, self.phases, self.results, self.names, self.partitions))


def _wanted(f: pb.JobFilter) -> _Wanted:
    if any(i >= 1 << 62 for i in f.job_ids) or any(t.array_job_id >= 1 << 62 for t in f.array_tasks):
        raise InvalidRequest("a job id of 2^62 or more: no such job")
    for what, items in (("job ids", f.job_ids), ("array tasks", f.array_tasks), ("users", f.uids),
                        ("names", f.names), ("partitions", f.partitions), ("states", f.phases),
                        ("states", f.results)):
        if len(items) > MAX_FILTER_ITEMS:
            raise InvalidRequest(f"{len(items)} {what} in one request; at most {MAX_FILTER_ITEMS}")
    return _Wanted(*(frozenset(x) if x else None for x in (f.uids, f.phases, f.results, f.names, f.partitions)))


def _unfiltered(f: pb.JobFilter) -> bool:
    """Whether a listing asks for every job (as _listed shows them): no job named, none of _wanted's lists."""
    return not (f.job_ids or f.array_tasks or f.include_old or _wanted(f).any)


def _matches(job: Job, w: _Wanted) -> bool:
    return ((w.uids is None or job.uid in w.uids) and (w.phases is None or job.phase in w.phases)
            and (w.results is None or job.result in w.results) and (w.names is None or job.name in w.names)
            and (w.partitions is None or job.partition in w.partitions))


def _strip_private(view: pb.Job) -> None:
    """What only a job's owner, root and operators may read: the script, environment and arguments."""
    for name in ("script", "environment", "argv", "submit_line"):
        view.request.ClearField(name)


def _kept(job: Job | None, expand: bool) -> bool:
    """A row list_rows keeps once made: a pending job's (but an array's task shown in its array's
    row), or an ended one's. A running job's TIME moves: its row is made for each listing."""
    return job is not None and (job.phase == JobPhase.DONE or job.phase == JobPhase.PENDING
                                and (expand or not job.array_job_id))


def _row(items, job: Job) -> str:
    """The job's row in squeue's default format (`items`: that format, compiled)."""
    return squeue.render(items, [pb.Job.FromString(_brief(job))], header=False)[0]


def _brief(job: Job) -> bytes:
    """A job as listings carry it to anyone: never its script, environment or arguments."""
    p = job.to_proto()
    _strip_private(p)
    return p.SerializeToString()
