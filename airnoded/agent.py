"""The node daemon's conversation with airctld: register, heartbeat, report exits, obey kills."""
from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from pathlib import Path

import grpc
import psutil

from air.protos.config import Config, NodeConfig
from air.airnoded import fence, jobfiles, progress, shepherding
from air.airnoded.cgroups import JobCgroups
from air.airnoded.givenup import GivenUp
from air.airnoded.gpus import GpuBackend, GpuError
from air.airnoded.health import HealthMonitor
from air.airnoded.killwatch import KillWatch
from air.airnoded.launcher import Launcher, StaleRun
from air.airnoded.metrics import NodeMetrics
from air.airnoded.shepherd import boot_id
from air.airnoded.steps import StepError, StepLimit, StepRunner, Stopping
from air.protos import air_pb2 as pb
from air.protos import rlimits, signals
from air.protos.limits import MAX_HEALTH_PER_BEAT
from air.protos import air_pb2_grpc as rpc
from air.protos.credential import signed

log = logging.getLogger("airnoded")

CALL_TIMEOUT_S = 5.0
FENCE_CHECK_S = 0.25   # how often the lease is looked at
BEAT_GAP_S = 0.05      # between the starts of two beats that an exit called early: a busy node's exits go together


def _state(pid: int) -> str | None:
    """A process's state (psutil's), None once it is gone."""
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return None


def _all_stuck(pids: list[int]) -> bool:
    """Whether what is left of a run is stuck: some process in uninterruptible sleep, and nothing else
    but zombies and processes already gone."""
    states = [_state(pid) for pid in set(pids)]
    return psutil.STATUS_DISK_SLEEP in states and \
        all(s in (psutil.STATUS_DISK_SLEEP, psutil.STATUS_ZOMBIE, None) for s in states)


def lease_clock() -> float:
    """Seconds that also run while the host or the daemon is suspended (CLOCK_BOOTTIME)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)
MAX_HEALTH_EVENTS = 1000   # health events kept while the controller cannot be reached (the newest)
MAX_LEFTOVERS = 1000       # ended runs' groups watched for what outlived SIGKILL (more are not drained for)


class Agent:
    def __init__(self, config: Config, node: NodeConfig, gpus: GpuBackend, auth=None):
        self.config = config
        self.auth = auth or config.controller.authenticator()
        self.node = node
        self.gpus = gpus
        self.interval = config.controller.heartbeat_interval_s
        self.cgroups = JobCgroups(node.name, spool=node.spool, pids_max=config.controller.max_pids_per_job,
                                  gpu_minors=gpus.device_minors())
        cc = config.controller
        self.kill_watch = KillWatch(cc.unkillable_timeout_s)
        # groups of runs that have ended here whose processes outlived SIGKILL: drained for as Kill task
        # failed once they have for unkillable_timeout_s, removed once they are empty
        self.leftover_watch = KillWatch(cc.unkillable_timeout_s)
        self._leftovers: dict[tuple[int, int], Path] = {}
        self.given_up = GivenUp(node.spool)   # runs given up, also by an earlier daemon (not drained for again)
        limits = functools.partial(rlimits.to_apply, propagate=cc.propagate_rlimits,
                                   excepted=cc.propagate_rlimits_except)
        self.launcher = Launcher(node.name, node.spool, self._exited, self.cgroups, cc.cluster_name,
                                 on_kill=self.kill_watch.killed, limits=limits, on_leftover=self._leftover)
        self.steps = StepRunner(node.name, node.address, self.cgroups, node.spool, cc.max_tasks_per_node,
                                cc.max_steps_per_user, on_idle=self.remove_job_dir, on_kill=self.kill_watch.killed,
                                limits=limits, batch_here=self.launcher.has_run, on_leftover=self._leftover)
        # the launcher keeps a folder a step of the run made first, and makes the run's group under the
        # step runner's lock for it (a step's end never removes it meanwhile)
        self.launcher.steps_here, self.launcher.group_lock = self.steps.has_ranks, self.steps.group_lock
        self.launcher.claim_group = self._claim_group
        self.progress = progress.ProgressReader(node.spool, cc.max_report_bytes)
        self.beat_failures = 0   # beats that failed with an error of this daemon's own (logged, counted)
        self._lease_file = fence.Lease(node.spool)   # what the fence keeper reads (an earlier daemon's, if any)
        # when a call to the controller that got an answer began: the earlier daemon's last, so that runs
        # it left are not run past their lease; else now
        self._lease = self._lease_file.value or lease_clock()
        self._fenced: set[tuple[int, int]] = set()   # runs this daemon has fenced since the lease ran out
        self._exits: dict[tuple[int, int], pb.JobExit] = {}   # (job, run) -> exit not yet acknowledged
        self._health: list[pb.HealthEvent] = []   # health events not yet delivered
        self._health_count = 0   # this daemon's health events so far: each is numbered (HealthEvent.number)
        # drains for runs given up, not yet delivered: the run is recorded as given up (self.given_up)
        # once the controller has taken its drain, never before (a daemon started in between drains again)
        self._drains: dict[int, tuple[pb.HealthEvent, tuple[int, int]]] = {}   # id(event) -> (event, run)
        self.monitor = HealthMonitor(node.name, gpus, node.ib_root, node.health_program, node.health_interval_s,
                                     node.health_timeout_s, self._health_event, node.max_gpu_temp_c)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        channel = signed(grpc.insecure_channel(config.controller.address), self.auth, config.controller.address)
        self._registry = rpc.NodeRegistryStub(channel)
        self._registered = False
        self.metrics = NodeMetrics(node.name)
        # which heartbeat is which (HeartbeatRequest.boot_id, started_ns, seq)
        self._boot_id, self._started_ns, self._seq = boot_id(), time.clock_gettime_ns(time.CLOCK_BOOTTIME), 0
        self._beat_began = self._progress_read = float("-inf")

    def seconds_since_controller(self) -> float:
        """Since the start of the last call to airctld that got an answer (the lease)."""
        return max(0.0, lease_clock() - self._lease)

    def fenced(self) -> str:
        """Why this node starts nothing now ("": it may): its lease is past the fence time, so the
        runs it has are being stopped, and a launch or step that arrives now was sent before that."""
        silent = self.seconds_since_controller()
        if silent < self.config.controller.fence_after_s:
            return ""
        return f"{self.node.name} is fenced: no word from the controller for {silent:.1f} s"

    def describe(self) -> pb.Node:
        cpus = self.node.cpus or os.cpu_count() or 1
        memory = self.node.memory_mb or psutil.virtual_memory().total // (1024 * 1024)
        return pb.Node(name=self.node.name, address=self.node.endpoint, cpus=cpus, memory_mb=memory,
                       gpus=self.gpus.inventory())

    def _health_event(self, event: pb.HealthEvent, drain_for: tuple[int, int] | None = None) -> None:
        """Queue a health event for the next heartbeat; with `drain_for`, the drain for that run given up.
        Past MAX_HEALTH_EVENTS the oldest go, but never a drain for a run given up (a job's flood of
        XIDs cannot push it out)."""
        log.warning("health: %s%s: %s", f"GPU {event.gpu} " if event.gpu >= 0 else "", event.signal, event.message)
        with self._lock:
            self._health_count += 1
            event.number = self._health_count   # (sent again until a beat with it is answered: taken once)
            self._health.append(event)
            if drain_for is not None:
                self._drains[id(event)] = (event, drain_for)
            excess = len(self._health) - MAX_HEALTH_EVENTS
            if excess > 0:
                kept = []
                for e in self._health:
                    if excess > 0 and id(e) not in self._drains:
                        excess -= 1
                        continue
                    kept.append(e)
                self._health = kept
        if event.critical:
            self._wake.set()

    def _exited(self, exit: pb.JobExit) -> None:
        with self._lock:
            self._exits[(exit.job_id, exit.run)] = exit
        self._wake.set()  # report at once rather than at the next beat

    def watch_lease(self) -> None:
        """The fence: a node that has not heard from the controller for fence_timeout_s stops every run
        here (the controller gives them to other nodes once node_timeout_s has passed)."""
        while not self._stopping.wait(FENCE_CHECK_S):
            try:
                self.check_lease()
            except Exception:
                log.exception("lease check failed")

    def check_lease(self) -> None:
        """Fence every run not fenced yet once the lease is fence_after_s old: SIGTERM now, SIGKILL when
        the lease is fence_after_s + fence_grace_s old (at once, after a freeze that passed it)."""
        cc = self.config.controller
        silent = lease_clock() - self._lease
        if silent < cc.fence_after_s:
            return
        runs = sorted((set(self.launcher.runs()) | set(self.steps.runs())) - self._fenced)
        if not runs:
            return
        self._fenced.update(runs)
        self.metrics.fences.inc()
        kill_in = max(0.0, cc.fence_after_s + cc.fence_grace_s - silent)
        log.warning("fenced: no word from the controller for %.1f s (fence after %.1f s); stopping %d runs: %s",
                    silent, cc.fence_after_s, len(runs), ", ".join(f"{j}.{r}" for j, r in runs))
        for job_id, run in runs:
            fence.mark_fenced(jobfiles.job_dir(self.node.spool, job_id, run))
            self.launcher.fence_run(job_id, run, kill_in)
            self.steps.signal(job_id, run, signal.SIGTERM if kill_in else 0)
            if kill_in:
                threading.Timer(kill_in, self.steps.signal, (job_id, run, 0)).start()
        self._health_event(pb.HealthEvent(gpu=-1, signal=signals.FENCED, time=time.time(), message=(
            f"no word from the controller for {silent:.1f} s: stopped runs {', '.join(f'{j}.{r}' for j, r in runs)}")))

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.check_lease()   # first thing, also after a freeze: never beat for runs past their lease
                if not self._registered:   # (no renewal here: the first heartbeat's answer renews)
                    reply = self._registry.Register(pb.RegisterRequest(node=self.describe()),
                                                    timeout=CALL_TIMEOUT_S)
                    self.interval = reply.heartbeat_interval_s or self.interval
                    self._registered = True
                    log.info("registered with %s", self.config.controller.address)
                self._beat(self._begin_beat())
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
                    log.error("the controller refused this node: %s", e.details())
                elif e.code() == grpc.StatusCode.ABORTED:   # a newer heartbeat of this node was taken first
                    self.metrics.heartbeat_failures.inc()
                    log.error("the controller took a newer heartbeat of %s than this one (%s): is another "
                              "airnoded running as this node on this host?", self.node.name, e.details())
                else:
                    self.metrics.heartbeat_failures.inc()
                    log.warning("controller %s unreachable: %s", self.config.controller.address,
                                e.code().name)
            except Exception:   # nothing a job does, and no bug of ours, stops the heartbeats
                self.beat_failures += 1
                log.exception("heartbeat failed (%d so far); trying again at the next beat", self.beat_failures)
            if self._wake.wait(self.interval):   # early, for an exit (or a critical health event): at once on a
                gap = BEAT_GAP_S - (lease_clock() - self._beat_began)   # quiet node; on a busy one the exits of
                if gap > 0:                                              # the next BEAT_GAP_S go with it
                    self._stopping.wait(gap)
            self._wake.clear()

    def _begin_beat(self) -> float:
        """When this beat begins (the lease is renewed from then, and the gap counted from it)."""
        self._beat_began = lease_clock()
        return self._beat_began

    def _beat(self, began: float) -> None:
        runs = self._runs_here()   # first: a run given up since goes with its end and its drain
        with self._lock:
            exits = list(self._exits.values())
            health = self._health[:MAX_HEALTH_PER_BEAT]   # (the oldest; the rest go with the next beats)
        self._seq += 1
        reply = self._registry.Heartbeat(
            pb.HeartbeatRequest(name=self.node.name, running=sorted({j for j, _ in self.launcher.runs_here()}),
                                exits=exits, health=health,
                                gpus=self.monitor.latest, ongoing=self.monitor.ongoing(),
                                progress=self._progress(runs, began, [(e.job_id, e.run) for e in exits]),
                                runs=[pb.RunRef(job_id=j, run=r) for j, r in runs],
                                boot_id=self._boot_id, started_ns=self._started_ns, seq=self._seq),
            timeout=min(CALL_TIMEOUT_S, self.interval))
        self.metrics.heartbeat_rtt.observe(lease_clock() - began)
        if not reply.reregister:   # (those past the controller's bound stay, to go again)
            self._delivered(health[:max(0, len(health) - reply.health_left)])
        if reply.reregister:
            self._registered = False
            self._wake.set()
            return
        acked = set(reply.acked)
        with self._lock:
            done = [e for e in exits if e.job_id in acked]
            for e in done:
                self._exits.pop((e.job_id, e.run), None)
        for e in done:   # the record of the run's end goes once the controller has it
            self.remove_job_dir(e.job_id, e.run)
        for job_id in reply.kill:
            for j, run in runs:
                if j == job_id:
                    log.warning("job %d is not running here as far as the controller knows; stopping run %d",
                                job_id, run)
                    self.launcher.signal(job_id, run, 0, self.config.controller.kill_wait_s)
                    self.steps.signal(job_id, run, 0)
        for stale in reply.stale:
            log.warning("job %d: run %d is not the job's current run; killing it", stale.job_id, stale.run)
            self.launcher.kill_run(stale.job_id, stale.run)
            self.steps.signal(stale.job_id, stale.run, 0)
        self._renew(began)   # only an answer from a controller that knows this node up, once stale runs are killed

    def _alive(self) -> set[tuple[int, int]]:
        """The runs with a script or ranks here, started or starting."""
        return set(self.launcher.runs_here()) | set(self.steps.runs())

    def _runs_here(self) -> list[tuple[int, int]]:
        """The runs a heartbeat reports: those alive here, less those given up after SIGKILL."""
        return sorted(self._alive() - self.kill_watch.given_up())

    def watch_kills(self) -> None:
        """On a thread of its own (its kills and looks never hold up a heartbeat): runs that outlive
        the daemon's SIGKILL, and what ended runs left behind (see killwatch)."""
        while not self._stopping.wait(max(1.0, self.interval)) and not self.steps.detaching.is_set():
            for key in self.kill_watch.due(self._alive()):
                try:
                    self._maybe_give_up(*key)
                except Exception:
                    log.exception("job %d: run %d not looked at by the kill watch this round", *key)
            try:
                self._watch_leftovers()
            except Exception:
                log.exception("the leftover watch failed this round")

    def _maybe_give_up(self, job_id: int, run: int) -> None:
        """A run the daemon is ending has outlived its SIGKILL by unkillable_timeout_s. Everything left of
        it is killed again; if every process left is in uninterruptible sleep (a hung file system or
        driver), none of them can run its own code again, so the run is reported ended and the node
        drains: an operator looks at what is stuck before resuming it (as Slurm's "Kill task failed").
        A process that is not (one forked past the kills) keeps the run: it is killed again next round."""
        left = self.launcher.kill_again(job_id, run) + self.steps.kill_again(job_id, run)
        if not _all_stuck(left):
            return
        what = f"processes of job {job_id} (run {run}) in uninterruptible sleep " \
               f"{self.kill_watch.since((job_id, run)):.0f} s after SIGKILL"
        if (job_id, run) in self.launcher.starting():
            return   # (a script of the run being started: never hidden from the controller)
        if (job_id, run) in self.given_up:   # (adopted again after a restart: drained for already)
            log.warning("job %d: %s; given up by an earlier airnoded, not drained for again", job_id, what)
        else:   # (first: any heartbeat that has the run's end has the drain too)
            self._drain_for(what, (job_id, run))
        if self.launcher.abandon(job_id, run, f"{what} on {self.node.name} (Kill task failed): given up") is False:
            return   # (its script has just ended: its watcher reports it; what it left drains anyway)
        self.kill_watch.give_up((job_id, run))

    def _delivered(self, health: list[pb.HealthEvent]) -> None:
        """The controller has taken these health events (the oldest not yet delivered): they go, and the
        runs whose drains were among them are recorded as given up."""
        sent = {id(h) for h in health}   # (the events are alive in `health`: their ids are theirs)
        with self._lock:
            self._health = [e for e in self._health if id(e) not in sent]   # (newer ones stay, whatever was trimmed)
            drained = [key for i, (_, key) in self._drains.items() if i in sent]
            for i in sent:
                self._drains.pop(i, None)
        for key in drained:
            self.given_up.add(key)

    def _drain_for(self, what: str, key: tuple[int, int]) -> None:
        log.error("%s; draining %s", what, self.node.name)
        self.metrics.unkillable.inc()
        self._health_event(pb.HealthEvent(gpu=-1, signal=signals.KILL_TASK_FAILED, critical=True, time=time.time(),
                                          message=what), drain_for=key)

    def _leftover(self, job_id: int, run: int, group: Path) -> None:
        """A run ended here, and processes of it outlived SIGKILL in its group (a python stuck in a driver
        under a shell that died)."""
        with self._lock:
            if len(self._leftovers) >= MAX_LEFTOVERS:
                return
            self._leftovers[(job_id, run)] = group
        self.leftover_watch.killed((job_id, run))
        if (job_id, run) in self.given_up:   # an earlier daemon drained for it: watched, not drained for again
            self.leftover_watch.give_up((job_id, run))
            log.warning("job %d: run %d, given up by an earlier airnoded, still has processes in its group; "
                        "the node is not drained for them again", job_id, run)

    def _watch_leftovers(self) -> None:
        """Each leftover group killed again, and removed once empty; one whose processes have all stayed
        in uninterruptible sleep for unkillable_timeout_s drains the node (Kill task failed), once. A
        group a new step of the run has taken again is the step runner's again (its end sees to it)."""
        with self._lock:
            leftovers = dict(self._leftovers)
        left = {}
        for key, group in leftovers.items():
            with self.steps.group_lock(key):   # (no step of the run starts in its own group meanwhile)
                if self.steps.streaming(*key):   # a step of the run runs in it again: not killed, looked at later
                    continue
                self.cgroups.kill(group)
                pids = self.cgroups.pids(group)
                if pids:
                    left[key] = pids
                    continue
                self.cgroups.remove(group)
                self._forget_leftover(key)
                self.steps.forget_group(*key, group)
                with self._lock:   # (gone: a drain for it still to be sent records nothing)
                    self._drains = {i: d for i, d in self._drains.items() if d[1] != key}
                self.given_up.discard(key)
            with self._lock:
                acknowledged = key not in self._exits   # (the record of the run's end stays until then)
            if acknowledged:
                self.remove_job_dir(*key)
        for key in self.leftover_watch.due(set(left)):
            if _all_stuck(left[key]):
                self.leftover_watch.give_up(key)
                self._drain_for(f"{len(left[key])} processes of job {key[0]} (run {key[1]}) left in uninterruptible "
                                f"sleep {self.leftover_watch.since(key):.0f} s after the run ended", key)

    def _claim_group(self, job_id: int, run: int, group: Path) -> None:
        """The launcher starts the run's script in its group: a group a step of the run made first is the
        script's now, never a step's to empty nor a leftover to kill."""
        self.steps.forget_group(job_id, run, group)
        self._forget_leftover((job_id, run))

    def _forget_leftover(self, key: tuple[int, int]) -> None:
        with self._lock:
            self._leftovers.pop(key, None)

    def _renew(self, began: float) -> None:
        """The controller answered a call that began at `began`: the lease runs from there, if the keeper
        can be told (a lease the keeper cannot read is no lease)."""
        if not self._lease_file.renew(max(self._lease, began)):
            return
        self._lease = max(self._lease, began)
        if self._fenced:
            log.info("the controller answers again; new runs may start here")
        self._fenced = set()
        for silent, runs in fence.take_keeper_fences(self.node.spool):   # (while this daemon was frozen or down)
            names = ", ".join(f"{j}.{r}" for j, r in runs)
            self._health_event(pb.HealthEvent(gpu=-1, signal=signals.FENCED, time=time.time(), message=(
                f"the fence keeper stopped runs {names} after {silent:.1f} s without word from the controller "
                "(the node daemon was frozen or down)")))

    def _progress(self, runs: list[tuple[int, int]], now: float, ending: list[tuple[int, int]] = ()) \
            -> list[pb.JobProgress]:
        """The runs' progress, read at most once a heartbeat interval (beats that exits call early, every
        BEAT_GAP_S on a busy node, go without it, as a quiet node's beats come once an interval); but the
        last report of a run `ending` (its exit in this beat, its folder still here) goes with its end."""
        every = now - self._progress_read >= self.interval
        if every:
            self._progress_read = now
        wanted = sorted(set(runs) | set(ending)) if every else list(ending)
        if not wanted:
            return []
        try:
            return self.progress.collect(time.time(), wanted, forget_others=every)
        except Exception:
            log.exception("progress reports not collected this beat")
            return []

    def remove_job_dir(self, job_id: int, run: int) -> None:
        """A run's folder on a node where only its ranks ran, once none run here (the batch node's goes
        with the script)."""
        if (job_id, run) not in self.launcher.runs_here() and not self.steps.has_ranks(job_id, run):
            jobfiles.remove_job_dir(self.node.spool, job_id, run)

    def adopt(self) -> None:
        """Take over what an earlier daemon on this node left running (its steps, then its batch scripts);
        what no one can watch any more is killed."""
        stepped: set = set()
        batch: list = []
        try:
            stepped = self.steps.adopt(self.node.spool)
        except Exception:
            log.exception("adopting steps failed")
        try:   # (each run on its own: one that fails is killed, never left running unwatched)
            batch = self.launcher.adopt(keep=stepped)
        except Exception:
            log.exception("adopting batch scripts failed")
        self.launcher.kill_leftover_cgroups(keep=stepped | set(batch))
        with self._lock:
            watched = set(self._leftovers)
        self.given_up.keep_only(watched | stepped | set(batch))   # (runs whose groups have gone are forgotten)
        try:
            jobfiles.clean_trash_soon(self.node.spool)   # what an earlier daemon left in the trash
        except Exception:
            log.exception("the trash's janitor did not start")

    def start_spawner(self) -> None:
        """Shepherds forked by a spawner, not each started as a Python of its own (tens of ms a run); none is
        needed where the shepherd program was built (shepherding.native)."""
        if shepherding.native() is not None:
            log.info("shepherds: %s", shepherding.native())
            return
        try:
            spawner = shepherding.Spawner(self.node.spool)
        except OSError as e:
            log.warning("no shepherd spawner (%s): each shepherd starts a Python of its own", e)
            return
        self.launcher.spawner = self.steps.spawner = spawner

    def stop(self) -> None:
        self.steps.detach()   # the ranks stay with their shepherds, for the next daemon
        self._stopping.set()
        self._wake.set()
        self.cgroups.close()


class AgentService:
    """NodeAgent: what airctld asks of this node."""

    SERVICE = "air.v1.NodeAgent"

    def __init__(self, agent: Agent):
        self.agent = agent
        self.service_uid = agent.config.controller.service_uid()

    def _identify(self, context, method: str, request):
        """The caller, from a credential made for this call on this node."""
        return self.agent.auth.identify(context, f"/{self.SERVICE}/{method}", request, self.agent.node.name)

    def _controller_only(self, context, method: str, request) -> None:
        who = self._identify(context, method, request)
        if not who.is_root and who.uid != self.service_uid:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"only the controller may call the node agent (caller uid {who.uid})")

    def Launch(self, request: pb.LaunchRequest, context):
        self._controller_only(context, "Launch", request)
        left = context.time_remaining()
        if left is not None and left <= 0:   # the controller has given up on it (and may have requeued the
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,   # job): a launch that waited here never starts
                          f"the launch of job {request.job.job_id} came too late")
        if fenced := self.agent.fenced():   # (answered as not reached: the controller tries again, then requeues)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{fenced}; job {request.job.job_id} is not started")
        try:
            self.agent.launcher.launch(request.job)
        except StaleRun as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return pb.LaunchReply()

    def Signal(self, request: pb.SignalRequest, context):
        self._controller_only(context, "Signal", request)
        job_id, run = request.job_id, request.run
        if request.reason:
            progress.write_stop_reason(self.agent.node.spool, job_id, run, request.reason)
        if request.steps_only and request.signal:   # sbatch's --signal without B: the steps' ranks, not the script
            return pb.SignalReply(found=self.agent.steps.signal(job_id, run, request.signal))
        batch = self.agent.launcher.signal(job_id, run, request.signal, request.grace_s, request.batch_only)
        if request.batch_only:
            return pb.SignalReply(found=batch)
        if request.signal == 0:
            self.agent.steps.forget_job(job_id, run)
            threading.Timer(request.grace_s + 1.0, self.agent.remove_job_dir, (job_id, run)).start()
        # steps get the signal at once; on a stop, SIGTERM now and SIGKILL with the batch script's group
        ranks = self.agent.steps.signal(job_id, run, request.signal or signal.SIGTERM)
        if request.signal == 0 and ranks:
            # SIGKILL after the grace time to this run's ranks still unreaped then (a newer run's are
            # spared, and no group number is signalled after its leader was reaped and it may be reused)
            threading.Timer(request.grace_s, self.agent.steps.signal, (job_id, run, 0)).start()
        return pb.SignalReply(found=batch or ranks)

    def InjectFault(self, request: pb.FaultRequest, context):
        self._controller_only(context, "InjectFault", request)
        gpus = self.agent.gpus
        if not getattr(gpus, "simulated", False):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"node {self.agent.node.name} has real GPUs; faults are injected only into simulated ones")
        try:
            gpus.inject(request, time.time())
        except GpuError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        self.agent.monitor.check(time.time())  # seen at once, not at the next interval
        return pb.FaultReply()

    def PrepareStep(self, request: pb.Step, context):
        self._controller_only(context, "PrepareStep", request)
        return pb.PrepareStepReply(free_port=self.agent.steps.prepare(request))

    def RunStep(self, request: pb.RunStepRequest, context):
        who = self._identify(context, "RunStep", request)
        if fenced := self.agent.fenced():   # (airrun follows again, as for a daemon away, and gives the node up
            context.abort(grpc.StatusCode.UNAVAILABLE, fenced)   # if it stays fenced)
        steps = self.agent.steps
        try:
            events, stop = (steps.attach if request.attach else steps.run)(request.job_id, request.step_id, who.uid,
                                                                           beats=request.beats)
        except StepError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except StepLimit as e:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except Stopping as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except PermissionError as e:   # before OSError, of which it is one
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        except (OSError, ValueError) as e:
            context.abort(grpc.StatusCode.INTERNAL, f"cannot start the step's ranks on {self.agent.node.name}: {e}")
        context.add_callback(stop)  # airrun went away (Ctrl-C, a failed rank elsewhere): kill the ranks
        yield from events
