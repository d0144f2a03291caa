"""The controller's dealings with node daemons: registration, heartbeats (exits, liveness, health
events), admin drain and resume, fault injection, and the node views airinfo shows.

A collaborator of Controller: it works on the controller's state under the controller's lock, and
follows the same order (pure transition, store transaction, memory, then act).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from air.airctld import events, node_events, scheduler
from air.airctld.errors import Conflict, Denied, InvalidRequest, NotFound, Overtaken
from air.airctld.events import TransitionError
from air.airctld.jobtable import JobTable
from air.airctld.model import Job, Node, evolve
from air.airctld.nodes import CALL_TIMEOUT_S
from air.airctld.policy import Policy
from air.airctld.store import Store
from air.protos import air_pb2 as pb
from air.protos import signals
from air.protos.config import Config
from air.protos.credential import Identity
from air.protos.limits import MAX_HEALTH_PER_BEAT
from air.protos.states import ACTIVE_PHASES, ExitCode, JobPhase, NodeState, Reason

log = logging.getLogger("airctld")

CONTROLLER_UID = -1   # "who" in event rows for changes the controller made on its own
MISSES_BEFORE_LOST = 2


class NodeReports:
    """Takes what node daemons say (registration, heartbeats: exits, runs, progress, health) and what
    operators ask of nodes (drain, resume, faults), and finds the nodes gone silent. A collaborator of
    the controller: what it reads and changes is given to it.

    config, store, policy: the controller's; lock, jobs, nodes: its lock, its job table and its nodes
    (read and replaced under the lock); clock, mono: the wall and the monotonic clock; clients: the node
    clients now (tests swap them); commit: the controller's way to record a job's change; signal: to
    stop a job's run; wake: a pass is due; dirty: says that something changed that may let a pending
    job start. Shared with the controller: heard (node -> last heard, monotonic), suspect (nodes a step
    lost), fence_wait (a requeued job's nodes that may still run it), misses (heartbeats without a
    running job), warned (jobs given their --signal warning: read), launching ((job, run) whose launch
    has not returned: read), unanswered (job -> (run, why) whose launch was never answered: the
    heartbeats of its node settle it), last_progress, moved and latest_report (a job's progress). Its own:
    telemetry (node -> its GPUs' latest reading) and the newest heartbeat taken from each node."""

    def __init__(self, config: Config, store: Store, policy: Policy, lock, jobs: JobTable, nodes: dict[str, Node],
                 clock: Callable[[], float], mono: Callable[[], float], clients: Callable[[], object],
                 commit: Callable[[list[tuple[Job, Job]], float, int], list[Job]],
                 signal: Callable[[Job, int], None], wake: threading.Event, dirty: Callable[[], None], *,
                 heard: dict[str, float], suspect: dict[str, float], fence_wait: dict[int, dict[str, float]],
                 misses: dict[int, int], warned: set[int], launching: set[tuple[int, int]],
                 unanswered: dict[int, tuple[int, str]], last_progress: dict[int, float], moved: dict[int, float],
                 latest_report: dict[int, str]):
        self.config = config
        self.store = store
        self.policy = policy
        self._lock = lock
        self.jobs = jobs
        self.nodes = nodes
        self.clock = clock
        self.mono = mono
        self.clients = clients
        self._commit = commit
        self._signal = signal
        self._wake = wake
        self._mark_dirty = dirty
        self.heard = heard
        self.suspect = suspect
        self.fence_wait = fence_wait
        self._misses = misses
        self._warned = warned
        self._launching = launching
        self._unanswered = unanswered
        self.last_progress = last_progress
        self.moved = moved
        self.latest_report = latest_report
        # a launch an earlier controller sent before it died may still reach its node until the launch's
        # deadline: until then, any running job may be on its way to its node (see heartbeat)
        self._inherited_until = mono() + CALL_TIMEOUT_S
        self.telemetry: dict[str, list[pb.GpuStatus]] = {}   # node -> its GPUs' latest reading
        self._beats: dict[str, tuple[str, tuple[int, int]]] = {}   # node -> its newest heartbeat taken (see heartbeat)
        # node -> ((boot_id, started_ns) of its daemon, the numbers of the health events of its last heartbeat
        # taken), kept in the store too: a restarted controller takes none of them again
        self._health_taken: dict[str, tuple[tuple[str, int], frozenset[int]]] = store.health_taken()

    def node_views(self) -> list[pb.Node]:
        with self._lock:
            active = self.jobs.active()
            free = scheduler.free_resources(self.nodes.values(), active)
            running = {}
            for job in active:
                for a in job.allocation:
                    running[a.node] = running.get(a.node, 0) + 1
            views = []
            for nc in self.config.nodes:
                n = self.nodes[nc.name]
                views.append(pb.Node(
                    name=n.name, address=n.address, cpus=n.cpus, memory_mb=n.memory_mb, gpus=n.gpus,
                    state=n.state, reason=n.reason, last_heartbeat=n.last_heartbeat,
                    partitions=[p.name for p in self.config.partitions if n.name in p.nodes],
                    gpus_alloc=len(n.gpus) - len(free[n.name].gpus), cpus_alloc=n.cpus - free[n.name].cpus,
                    jobs_running=running.get(n.name, 0), gpu_status=self.telemetry.get(n.name, ()),
                    drain_signal=n.drain_signal))
            return views

    # ------------------------------------------------------------ node daemons

    def register(self, info: pb.Node) -> None:
        nc = self.config.node(info.name)
        if nc is None:
            raise NotFound(f"node {info.name} is not in the configuration {self.config.path}")
        now = self.clock()
        with self._lock:
            node = node_events.registered(self.nodes[info.name], info, now)
            with self.store.transaction():
                self.store.save_node(node)
            self.nodes[info.name] = node
            self.heard[info.name] = self.mono()
            self._mark_dirty()
            # a daemon that starts (again) may have adopted runs whose stop it never received
            stopping = [j for j in self.jobs.in_phase(JobPhase.COMPLETING) if info.name in j.node_names]
        log.info("node %s registered from %s: %d cpus, %d gpus", info.name, info.address, info.cpus,
                 len(info.gpus))
        for job in stopping:
            self._signal(job, 0)
        self._wake.set()

    def heartbeat(self, req: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        now = self.clock()
        with self._lock:
            node = self.nodes.get(req.name)
            if node is None or node.state not in (NodeState.UP, NodeState.DRAIN):
                return pb.HeartbeatReply(reregister=True)
            # a heartbeat sent before the newest one taken (its daemon gave up waiting for it, or a later daemon
            # started) is an older view of the node: it could clear a requeued job's fence wait, or count a
            # run as missing, that the newer one has seen alive. It is ignored.
            if req.boot_id:
                last = self._beats.get(req.name)
                mark = (req.started_ns, req.seq)
                if last is not None and last[0] == req.boot_id and mark <= last[1]:
                    log.warning("node %s: heartbeat %d of its daemon came after a newer one; ignored", req.name,
                                req.seq)   # (refused, not answered: no daemon renews its lease on it)
                    raise Overtaken(f"heartbeat {req.seq} of {req.name} came after a newer one")
                self._beats[req.name] = (req.boot_id, mark)
            self.nodes[req.name] = node = evolve(node, last_heartbeat=now)
            self.heard[req.name] = self.mono()
            self.suspect.pop(req.name, None)
            self.telemetry[req.name] = list(req.gpus[:len(node.gpus)])   # (no more than it registered)
            if req.progress:
                self._take_progress(req.name, req.progress, now)
            if node.state == NodeState.DRAIN and node.drain_signal and not req.ongoing:
                self._maybe_return(node, now)
            reported = {e.job_id for e in req.exits}
            changes, ended = [], set()
            for e in req.exits:
                job = self.jobs.get(e.job_id)
                if job is not None and job.phase in ACTIVE_PHASES and job.batch_node == req.name \
                        and e.run == job.restart_count and job.job_id not in ended:   # (an older run's exit says
                    ended.add(job.job_id)   # nothing of this one; a copy of an exit is not a second end)
                    if e.fenced:   # the node lost the controller and stopped it: a node failure
                        changes.append((job, events.node_lost(job, now, Reason.NODE_FAIL,
                                                              f"node {req.name} fenced itself: {e.detail}")))
                        continue
                    # airrun's ExitCode.NODE_LOST names no node: it may be any of this run's steps' other nodes
                    lost = (self.store.step_nodes(job.job_id, job.restart_count) & set(job.node_names)) - {req.name} \
                        if e.exit_code == ExitCode.NODE_LOST and not e.exit_signal else set()
                    changes.append((job, events.finished(job, now, e.exit_code, e.exit_signal, e.detail,
                                                         e.launch_failed, e.out_of_memory,
                                                         warned=e.job_id in self._warned,
                                                         step_left_batch_node=bool(lost))))
                    # none of those nodes takes new work until it is heard from (the job's next run waits
                    # for their fence: every requeue does, see Controller._commit)
                    self.suspect.update({n: now for n in lost})
            running = set(req.running)
            runs = {(r.job_id, r.run) for r in req.runs}
            launching = {j for j, _ in self._launching}
            inherited = self.mono() < self._inherited_until
            earliest: dict[int, int] = {}   # job id -> its earliest run here (where a job waits on a fence)
            for j, r in runs if self.fence_wait else ():
                earliest[j] = min(r, earliest.get(j, r))
            for job_id, waits in list(self.fence_wait.items()):   # this node answers: without that job's runs?
                job = self.jobs.get(job_id)
                if req.name not in waits or job is None:
                    pass
                elif earliest.get(job_id, job.restart_count) < job.restart_count:   # an earlier run still here
                    # (killed below as stale): its node renews its lease by answering, so the fence's
                    # deadline says nothing while it does; the job waits until the node reports it gone
                    waits[req.name] = max(waits[req.name], self.heard[req.name] + self.config.controller.fenced_by_s)
                elif job_id not in launching and not inherited:   # (no launch of an earlier run may still
                    del waits[req.name]                               # reach the node)
                if not waits:   # the job may start again now, not at the fence's deadline
                    del self.fence_wait[job_id]
                    self._mark_dirty()
                    self._wake.set()
            stale = [r for r in req.runs if (j := self.jobs.get(r.job_id)) is None
                     or j.phase not in ACTIVE_PHASES or r.run != j.restart_count   # ended, requeued, or older
                     or req.name not in j.node_names]   # or not this node's (a job id a restored store gave again)
            current_exits = {e.job_id for e in req.exits if (j := self.jobs.get(e.job_id)) is not None
                             and e.run == j.restart_count}
            for job in self.jobs.active():
                if job.batch_node != req.name:
                    continue   # another node's heartbeat says nothing about this job's batch script
                here = job.job_id in running and (job.job_id, job.restart_count) in runs
                if here or job.job_id in current_exits or (job.job_id, job.restart_count) in self._launching \
                        or inherited:
                    self._misses.pop(job.job_id, None)
                    if here:   # (its unanswered launch had started it after all)
                        self._unanswered.pop(job.job_id, None)
                    continue
                misses = self._misses[job.job_id] = self._misses.get(job.job_id, 0) + 1
                unanswered = self._unanswered.get(job.job_id, (-1, ""))
                if misses >= MISSES_BEFORE_LOST and job.phase == JobPhase.COMPLETING:
                    changes.append((job, events.finished(job, now, 0, 0)))  # stopped before it ran
                elif misses >= MISSES_BEFORE_LOST and unanswered[0] == job.restart_count:
                    changes.append((job, events.launch_unanswered(job, now, unanswered[1])))
                elif misses >= MISSES_BEFORE_LOST:
                    changes.append((job, events.node_lost(job, now, Reason.JOB_LOST,
                                                     f"node {req.name} no longer has the job")))
            failing = []
            sent = list(req.health)
            if len(sent) > MAX_HEALTH_PER_BEAT:
                # a daemon sends no more; a message's worth (hundreds of thousands) written under the lock
                # would hold up every node's heartbeat until the nodes fenced themselves. The reply says how
                # many are left: the daemon keeps those and sends them again.
                log.warning("node %s sent %d health events in one heartbeat; the first %d are taken",
                            req.name, len(sent), MAX_HEALTH_PER_BEAT)
                sent = sent[:MAX_HEALTH_PER_BEAT]
            health = self._health_not_taken(req, sent)
            with self.store.transaction():   # health events, drain and job changes: all or none
                if sent and req.boot_id:
                    # what this heartbeat carried, as taken once it commits (run first of what the commit runs;
                    # a failure before the commit has them taken when they come again)
                    taken = ((req.boot_id, req.started_ns), frozenset(e.number for e in sent if e.number))
                    if taken != self._health_taken.get(req.name):   # (copies alone: written already)
                        self.store.save_health_taken(req.name, *taken)
                        self.store.after_commit(lambda: self._health_taken.__setitem__(req.name, taken))
                if health:
                    failing = self._health(node, health, now, {old.job_id for old, _ in changes})
                    changes += failing
                self._commit(changes, now, CONTROLLER_UID)
            for job_id in [j for j, (run, _) in self._unanswered.items()   # (settled, or stopped since)
                           if (x := self.jobs.get(j)) is None or x.phase != JobPhase.RUNNING or x.restart_count != run]:
                del self._unanswered[job_id]
            for old, _ in failing:
                self._signal(old, 0)
            kill = [i for i in running if (j := self.jobs.get(i)) is None
                    or j.phase in (JobPhase.DONE, JobPhase.PENDING)]   # ended, or requeued meanwhile
        if changes:
            self._wake.set()
        for r in stale:
            log.warning("job %d: run %d still runs on %s, but the job is on run %d; killing it", r.job_id, r.run,
                        req.name, self.jobs.get(r.job_id).restart_count if self.jobs.get(r.job_id) else -1)
        return pb.HeartbeatReply(acked=sorted(reported), kill=kill, stale=stale,
                                 health_left=len(req.health) - len(sent))

    def _take_progress(self, node: str, reports, now: float) -> None:
        """Ranks' progress from a node: when the job last moved (hang detection), its newest report
        (airq -l, aircontrol show job) and the history (airstat). Only for jobs running on that node,
        and only reports within max_report_bytes (the node daemon checks the same)."""
        rows, moved, latest, moved_mono = [], {}, {}, {}
        mono = self.mono()
        limit = self.config.controller.max_report_bytes
        for p in reports:
            job = self.jobs.get(p.job_id)
            if job is None or job.phase not in ACTIVE_PHASES or node not in job.node_names \
                    or p.run != job.restart_count or p.job_id in moved:
                continue   # not this node's, a stale run's, or a copy (a daemon sends one a run a beat)
            age = max(0.0, p.age_s)
            moved[p.job_id] = max(moved.get(p.job_id, self.last_progress.get(p.job_id, 0.0)), now - age)
            if job.phase == JobPhase.RUNNING:
                moved_mono[p.job_id] = max(moved_mono.get(p.job_id, self.moved.get(p.job_id, 0.0)), mono - age)
            size = len(p.report.encode())
            if size > limit:
                log.warning("job %d: a progress report of %d bytes from %s ignored (max_report_bytes %d)",
                            p.job_id, size, node, limit)
            elif p.report:
                latest[p.job_id] = p.report
                rows.append((p.job_id, now, p.report))
        if rows:
            with self.store.transaction():
                self.store.add_reports(rows)
        self.last_progress.update(moved)   # only once the history is written
        self.moved.update(moved_mono)
        self.latest_report.update(latest)

    def _maybe_return(self, node: Node, now: float) -> None:
        """A node drained by a condition that has cleared (an IB port ACTIVE again, a GPU cooled down,
        the health program passing) returns to service when its config allows; XID, ECC and NVLink
        faults, and admin drains, always wait for `aircontrol node resume`."""
        nc = self.config.node(node.name)
        if nc is None or not nc.health_auto_resume or not signals.kind_of(node.drain_signal).clears_by_itself:
            return
        back = node_events.returned(node)
        with self.store.transaction():
            self.store.save_node(back)
            self.store.add_node_events(node.name, [pb.HealthEvent(
                gpu=-1, signal=signals.RESUMED, message=f"{node.drain_signal} cleared; back in service", time=now)])
        self.nodes[node.name] = back
        self._mark_dirty()
        log.info("node %s back in service: %s cleared", node.name, node.drain_signal)

    def _health_not_taken(self, req: pb.HeartbeatRequest, sent: list) -> list:
        """The heartbeat's health events (`sent`) less those its daemon's last heartbeat taken carried. A node
        sends its events until a heartbeat carrying them is answered, every one not yet answered in each
        heartbeat: an answer lost after the commit has them come again, and each would be recorded, and
        drain the node (which an operator may have resumed meanwhile), a second time. The daemon numbers
        its events. Only a number the last heartbeat taken carried is left out, so that a number out of
        order, or one far ahead, costs a copy at worst, never a later event. The numbers are kept in the
        store with the events, so a controller restarted after the commit, before the node sent them
        again, leaves them out too. Unnumbered events, and those of a heartbeat that names no daemon, are
        always taken."""
        taken = self._health_taken.get(req.name)
        if not req.boot_id or taken is None or taken[0] != (req.boot_id, req.started_ns):
            return sent
        return [e for e in sent if not e.number or e.number not in taken[1]]

    def _health(self, node: Node, health, now: float, already: set[int]) -> list[tuple[Job, Job]]:
        """Record a node's health events; a critical one drains the node and, where its kind says so,
        ends the jobs on the failing GPU (every job on the node, for a node-wide fault) as NODE_FAIL. Part of the
        heartbeat's transaction: the drain is taken into memory, and the jobs signalled, once it commits."""
        critical = [e for e in health if e.critical]
        node = self.nodes[node.name]
        with self.store.transaction():
            self.store.add_node_events(node.name, health, now)
            drained = node
            for event in critical:   # (each: one that only an operator lifts outlasts one that lifts itself)
                drained = node_events.health_drained(drained, event) or drained
            if drained is not node:
                node = drained
                self.store.save_node(node)
                self.store.after_commit(lambda n=node: self._drained(n))
        changes = []
        for event in critical:
            if not signals.kind_of(event.signal).ends_jobs:
                continue
            for job in self.jobs.active():
                if job.job_id in already:
                    continue
                mine = [a for a in job.allocation if a.node == node.name]
                if mine and (event.gpu < 0 or event.gpu in mine[0].gpus):
                    where = f"GPU {event.gpu} of {node.name}" if event.gpu >= 0 else node.name
                    changes.append((job, events.node_lost(job, now, Reason.NODE_FAIL,
                                                          f"{where}: {event.signal} ({event.message})")))
                    already.add(job.job_id)
        return changes

    def _drained(self, node: Node) -> None:
        self.nodes[node.name] = node
        log.warning("node %s drained: %s", node.name, node.reason)

    def update_node(self, name: str, state: NodeState, reason: str, who: Identity) -> None:
        if not self.policy.is_operator(who):
            raise Denied("only root and operators may drain or resume nodes")
        with self._lock:
            node = self.nodes.get(name)
            if node is None:
                raise NotFound(f"node {name} does not exist")
            if state == NodeState.DRAIN:
                new = node_events.drained(node, reason or f"drained by uid {who.uid}")
            elif state == NodeState.UP:
                try:
                    new = node_events.resumed(node)
                except TransitionError as e:
                    raise Conflict(str(e)) from None
            else:
                raise InvalidRequest("a node can be set to DRAIN or UP")
            with self.store.transaction():
                self.store.save_node(new)
                self.store.add_node_events(name, [pb.HealthEvent(
                    gpu=-1, signal=signals.ADMIN, message=f"{new.state.name} by uid {who.uid}: {reason}",
                    time=self.clock())])
            self.nodes[name] = new
            self._mark_dirty()
        self._wake.set()

    def inject_fault(self, fault: pb.FaultRequest, who: Identity) -> None:
        if not self.policy.is_operator(who):
            raise Denied("only root and operators may inject faults")
        node = self.nodes.get(fault.node)
        if node is None:
            raise NotFound(f"node {fault.node} does not exist")
        self.clients().inject_fault(node.address, fault)

    def check_liveness(self, now: float) -> None:
        timeout = self.config.controller.node_timeout_s
        with self._lock:
            mono = self.mono()
            silent = [n for n in self.nodes.values()
                      if n.state in (NodeState.UP, NodeState.DRAIN) and mono - self.heard.get(n.name, mono) > timeout]
            if not silent:
                return
            names = {n.name for n in silent}
            changes = []
            for job in self.jobs.active():
                down = names.intersection(job.node_names)
                if down:
                    changes.append((job, events.node_lost(job, now, Reason.NODE_FAIL,
                                                          f"node {sorted(down)[0]} stopped responding")))
            down = [node_events.silent(n, timeout) for n in silent]
            with self.store.transaction():
                for node in down:
                    self.store.save_node(node)
                self._commit(changes, now, CONTROLLER_UID)
            self.nodes.update((n.name, n) for n in down)
            self._mark_dirty()
        for n in silent:
            log.warning("node %s is DOWN: silent for over %g s", n.name, timeout)
        for old, _ in changes:  # the rest of the job may still run on nodes that are up
            self._signal(old, 0)
