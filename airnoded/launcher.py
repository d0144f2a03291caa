"""Starting and stopping a job's batch script on this host.

The environment and the output paths are computed by pure functions (tested against
expected values); `Launcher` does the I/O: the script file in the spool directory, the
process in its own session and process group, as the job's owner, and the kill that
reaches every process of the group.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import psutil

from air.airnoded import fence, jobfiles, progress, shepherding
from air.airnoded.cgroups import JobCgroups, local_devices
from air.airnoded.procs import as_owner, killpg
from air.airnoded.shepherd import start_time
from air.airnoded.shepherding import BATCH, Child, Herd, Start
from air.protos import air_pb2 as pb
from air.protos.limits import memory_limit_bytes
from air.protos.outputs import output_paths
from air.protos.jobenv import inherited, job_variables

log = logging.getLogger("airnoded")

MAX_STATUS_BYTES = 64 * 1024   # what the start-up (shepherding.Start) may say before the script runs

MAX_RUNS_REMEMBERED = 100_000   # jobs whose newest run a node remembers (to refuse older launches)

class StaleRun(Exception):
    """A launch of a run older than one this node has seen."""


def job_environment(job: pb.Job, node: str, spool: Path | None = None, cluster: str = "") -> dict[str, str]:
    """The batch script's environment: the submitter's exported variables, then AIR_* and SLURM_*
    (what sbatch sets and tools such as submitit and Lightning read; see docs/slurm.md): the job's
    (jobenv), and this node's."""
    here = next((a for a in job.allocation if a.node == node), None)
    gpus = list(here.gpus) if here else []
    # (a job submitted from inside another must not keep that job's variables: this job's are set below)
    env = inherited(dict(job.request.environment))
    env.update(job_variables(job, cluster))
    env.update({
        "AIR_GPUS_PER_NODE": str(len(gpus)),
        "AIR_NODENAME": node,
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
        "SLURMD_NODENAME": node,
        "SLURM_GPUS_ON_NODE": str(len(gpus)),
        "SLURM_JOB_GPUS": ",".join(str(g) for g in gpus),   # the node's indices, whatever CUDA numbers them
    })
    if here is not None:
        env["SLURM_CPUS_ON_NODE"] = str(here.cpus)
    if spool is not None:
        env.update(progress.environment(spool, job.job_id, job.restart_count))
    return env


@dataclass
class RunningJob:
    job_id: int
    run: int
    herd: Herd               # the run's shepherd: the batch script's parent
    pgid: int                # the batch script's process (and its group's number)
    status_fd: int = -1      # read end of the start-up status pipe
    cgroup: Path | None = None
    killed: bool = False
    fenced: bool = False     # stopped by the node's own fence, not by the controller
    adopted: bool = False    # started by an earlier daemon on this node
    given_up: bool = False   # outlived SIGKILL: its end was reported when it was given up (abandon)
    done: threading.Event = field(default_factory=threading.Event)


ExitCallback = Callable[[pb.JobExit], None]


class Launcher:
    def __init__(self, node: str, spool: Path, on_exit: ExitCallback, cgroups: JobCgroups | None = None,
                 cluster: str = "", on_kill: Callable[[tuple[int, int]], None] = lambda key: None,
                 limits: Callable[[Mapping[str, int]], list[list[int]]] = lambda wanted: [],
                 on_leftover: Callable[[int, int, Path], None] = lambda job_id, run, group: None):
        self.node = node
        self.steps_here: Callable[[int, int], bool] = lambda job_id, run: False   # the step runner's, once made
        self.group_lock: Callable[[tuple[int, int]], threading.Lock] = lambda key: threading.Lock()
        self.claim_group: Callable[[int, int, Path], None] = lambda job_id, run, group: None
        self.on_leftover = on_leftover   # a run's group that would not empty after its end (the leftover watch)
        self.limits = limits     # the submitter's resource limits -> those to set (config's propagation)
        self.on_kill = on_kill   # told of every run sent SIGKILL (the kill watch)
        self.cluster = cluster
        self.spool = spool
        self.on_exit = on_exit
        self.cgroups = cgroups or JobCgroups(node, mode="none")
        self.spawner: shepherding.Spawner | None = None   # forks shepherds cheaply, once started
        self.jobs: dict[tuple[int, int], RunningJob] = {}   # (job id, run) -> its batch script here
        self._newest: dict[int, int] = {}                   # job id -> the newest run launched here
        self._starting: set[tuple[int, int]] = set()        # (job id, run) being spawned now
        self._lock = threading.Lock()

    def running(self) -> list[int]:
        """Jobs with a batch script here."""
        with self._lock:
            return sorted({job_id for job_id, _ in self.jobs})

    def runs(self) -> list[tuple[int, int]]:
        """Runs whose batch script runs here (started: what a fence can stop)."""
        with self._lock:
            return list(self.jobs)

    def runs_here(self) -> list[tuple[int, int]]:
        """runs(), and those being started: what a heartbeat reports (it must never say a run is not
        here while its launch may still start it) and whose folder stays."""
        with self._lock:
            return list(self.jobs) + [key for key in self._starting if key not in self.jobs]

    def starting(self) -> set[tuple[int, int]]:
        """Runs whose script is being started here."""
        with self._lock:
            return set(self._starting)

    def has_run(self, job_id: int, run: int) -> bool:
        """Whether this run's batch script runs here, or is being started."""
        with self._lock:
            return (job_id, run) in self.jobs or (job_id, run) in self._starting

    def launch(self, job: pb.Job) -> None:
        """Start the batch script of this run of the job; a failure to start is reported as the run's
        exit. A run older than one seen here is refused (StaleRun); an older run still here is killed. A
        run launched here before is never started again, running or ended: a launch whose answer was lost
        is retried, and may come after the run's end."""
        run = job.restart_count
        with self._lock:
            if (job.job_id, run) in self.jobs or (job.job_id, run) in self._starting:
                return  # a retried launch of a run already running here, or being started
            newest = self._newest.get(job.job_id, -1)
            if run < newest:
                raise StaleRun(f"run {run} of job {job.job_id} is older than run {newest}, launched here already")
            if run == newest:   # a retried launch whose first try was served (its answer lost) and has ended
                log.info("job %d: run %d was launched here already and has ended; not started again", job.job_id,
                         run)
                return
            self._newest.pop(job.job_id, None)
            self._newest[job.job_id] = run
            while len(self._newest) > MAX_RUNS_REMEMBERED:
                del self._newest[next(iter(self._newest))]
            older = [r for (j, _), r in self.jobs.items() if j == job.job_id]
            self._starting.add((job.job_id, run))
        try:
            self._start(job, run, older)
        finally:
            with self._lock:
                self._starting.discard((job.job_id, run))

    def _start(self, job: pb.Job, run: int, older: list) -> None:
        for stale in older:
            log.warning("job %d: run %d is still here as run %d starts; killing it", job.job_id, stale.run, run)
            self._kill_now(stale)
        try:
            running = self._spawn(job)
        except Exception as e:   # OSError, or a value the kernel refuses: the run's exit, never the daemon's
            detail = f"cannot start the batch script on {self.node}: {getattr(e, 'strerror', None) or e}" + \
                     (f": {e.filename}" if getattr(e, "filename", None) else "")
            log.warning("job %d: %s", job.job_id, detail)
            if not self.steps_here(job.job_id, run):   # (a step of the run that came first keeps its folder)
                jobfiles.remove_job_dir(self.spool, job.job_id, run)
            self.on_exit(pb.JobExit(job_id=job.job_id, run=run, exit_code=1, detail=detail, launch_failed=True))
            return
        with self._lock:
            self.jobs[(job.job_id, run)] = running
        threading.Thread(target=self._wait, args=(running,), name=f"job-{job.job_id}.{run}", daemon=True).start()

    def _spawn(self, job: pb.Job) -> RunningJob:
        req = job.request
        same_user = job.uid == os.getuid()
        # root's, fresh for this run, unless a step of it came first (airrun's own allocation starts one at once)
        jobdir = jobfiles.create_job_dir(self.spool, job.job_id, job.restart_count,
                                         keep=self.steps_here(job.job_id, job.restart_count))
        jobfiles.write_root_file(jobdir, "script", req.script.encode(), 0o700,
                                 owner=None if same_user else (job.uid, job.gid))
        script = jobdir / "script"
        out_path, err_path = output_paths(job, self.node)
        kwargs, owner_env = as_owner(job.uid, job.gid)
        progress.make(jobdir, job.uid, job.gid)
        env = {**job_environment(job, self.node, self.spool, self.cluster), **owner_env}
        env["PWD"] = req.workdir   # (where the script starts, as a shell's cd would say; not the submitter's)
        separate_err = err_path if err_path and err_path != out_path else ""
        here = next((a for a in job.allocation if a.node == self.node), None)
        if self.cgroups.gpu_minors and here is not None and env["CUDA_VISIBLE_DEVICES"]:
            # the devices group below lets it open its job's GPUs only: CUDA numbers them from 0
            env["CUDA_VISIBLE_DEVICES"] = local_devices(env["CUDA_VISIBLE_DEVICES"], list(here.gpus))
        # the group is made (or a step's, made first, claimed) under the step runner's lock for the run: a
        # step's end after it sees the script starting here (has_run) and leaves the group alone
        with self.group_lock((job.job_id, job.restart_count)):
            group = self.cgroups.create(job.job_id, job.restart_count,
                                        memory_limit_bytes(req.mem_per_node_mb, req.mem_per_gpu_mb,
                                                           len(here.gpus) if here else 0),
                                        list(here.gpus) if here else None)
            if group is not None:
                self.claim_group(job.job_id, job.restart_count, group)
        # (the group is recorded by the shepherd, in its record's second line, before anything joins it)
        # as the owner, before the script: its working directory and output files (so a job writes only where its
        # owner could); a failure is written to the status pipe (its stdout and stderr until then), whose every
        # copy is closed by the time the script runs: the daemon reads EOF at exec
        start = Start(req.workdir, out_path, separate_err, req.open_truncate)
        status_r, status_w = os.pipe()
        try:
            herd = shepherding.spawn(jobdir, BATCH, [Child([str(script), *req.argv], env, status_w, status_w, start)],
                                     None if same_user else job.uid, job.gid,
                                     list(kwargs.get("extra_groups", [job.gid])), group, spawner=self.spawner,
                                     rlimits=self.limits(req.rlimits), named=False)
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        pgid = herd.pids.get(0, 0)
        log.info("job %d started: pid %d, gpus %s", job.job_id, pgid,
                 ",".join(str(g) for g in here.gpus) if here and here.gpus else "-")
        return RunningJob(job.job_id, job.restart_count, herd, pgid, status_fd=status_r, cgroup=group)

    def _wait(self, running: RunningJob) -> None:
        problem = self._start_status(running) if running.status_fd >= 0 else ""
        running.herd.wait()   # the shepherd reaps the script, after killing what it left in its group
        status = running.herd.exits.get(0)
        if status is None:   # the shepherd died without saying how the script ended (killed with it, or a crash)
            running.herd.kill_children()
        running.done.set()
        oom, peak = self._end_cgroup(running)
        with self._lock:
            if self.jobs.get((running.job_id, running.run)) is running:
                del self.jobs[(running.job_id, running.run)]
            given_up = running.given_up
        if given_up:   # its end was reported when it was given up; its folder went once acknowledged
            log.warning("job %d: run %d, given up after SIGKILL, has ended", running.job_id, running.run)
            return
        if status is None:   # no exit to report: the controller finds the run gone and requeues it (JobLost)
            log.warning("job %d: run %d's shepherd ended without a record of the script's end", running.job_id,
                        running.run)
            jobfiles.remove_job_dir(self.spool, running.job_id, running.run)
            return
        code, sig = _wait_status(status)
        # a fence (the daemon's, or the keeper's while the daemon was frozen) marks a run before it signals it:
        # the script's end is the fence's if the mark came first
        running.fenced = fence.fenced_before_end(jobfiles.job_dir(self.spool, running.job_id, running.run), BATCH)
        if problem:
            log.warning("job %d could not start: %s", running.job_id, problem)
            self.on_exit(pb.JobExit(job_id=running.job_id, run=running.run, exit_code=code, launch_failed=True,
                                    detail=f"cannot start the job on {self.node}: {problem.splitlines()[-1]}"))
        else:
            self.on_exit(pb.JobExit(job_id=running.job_id, run=running.run, exit_code=code, exit_signal=sig,
                                    killed=running.killed, fenced=running.fenced, out_of_memory=oom,
                                    peak_memory_bytes=peak,
                                    detail="stopped by the node's fence: no word from the controller"
                                    if running.fenced else ""))
        # the folder, with the shepherd's record of the exit, stays until the controller has the exit
        # (a daemon restarted before that reports it again); the agent removes it then

    @staticmethod
    def _start_status(running: RunningJob) -> str:
        """What the start-up (shepherding.Start) said before the script ran (EOF once it is exec'd). Read until EOF
        or until the shepherd has ended: a process of the job's owner may hold the pipe open."""
        chunks, size = [], 0
        poller = select.poll()
        poller.register(running.status_fd, select.POLLIN)
        proc = running.herd.proc
        try:
            while True:
                if poller.poll(500):
                    data = os.read(running.status_fd, 4096)
                    if not data:
                        break
                    if size < MAX_STATUS_BYTES:
                        chunks.append(data)
                        size += len(data)
                elif proc is None or proc.poll() is not None:
                    break
        finally:
            os.close(running.status_fd)
        return b"".join(chunks)[:MAX_STATUS_BYTES].decode(errors="replace").strip()

    def _end_cgroup(self, running: RunningJob) -> tuple[bool, int]:
        """Kill what is left in the run's cgroup (processes that left its process group), read whether
        the kernel killed any for memory, and remove the group; one that will not empty goes to the
        leftover watch (on_leftover) instead."""
        group = running.cgroup
        if group is None:
            return False, 0
        emptied = self.cgroups.empty(group)
        oom, peak = self.cgroups.oom_kills(group) > 0, self.cgroups.peak_memory(group)
        if emptied:
            self.cgroups.remove(group)
        else:
            log.warning("job %d: processes of run %d outlive SIGKILL; cgroup %s kept", running.job_id, running.run,
                        group)
            self.on_leftover(running.job_id, running.run, group)
        return oom, peak

    def adopt(self, keep: set[tuple[int, int]] = frozenset()) -> list[tuple[int, int]]:
        """Take over the batch scripts an earlier daemon on this node started: each whose shepherd still
        runs is watched as if launched here; one whose shepherd ended while no daemon watched is
        reported with the exit its record holds. Folders of runs with nothing left in them, and not in
        `keep` (runs whose steps the step runner adopted), are removed, and what a daemon without
        shepherds left in them killed. Returns the runs adopted."""
        adopted = []
        for entry in os.scandir(self.spool):
            key = jobfiles.parse_job_dir(entry.name)
            if key is None:
                continue
            job_id, run = key
            folder = Path(entry.path)
            if BATCH in shepherding.tags(folder):
                try:
                    running = self._adopt_one(folder, job_id, run)
                except Exception as e:   # a record this daemon cannot read: the controller learns it is gone
                    log.warning("job %d: run %d left by an earlier airnoded cannot be adopted: %s", job_id, run, e)
                    shepherding.adopt(folder, BATCH).kill_children()
                else:
                    adopted.append(key)
                    threading.Thread(target=self._wait, args=(running,), name=f"job-{job_id}.{run}",
                                     daemon=True).start()
                    continue
            elif key not in keep:
                self._kill_unwatched(folder, job_id)
            if key not in keep:
                jobfiles.remove_job_dir(self.spool, job_id, run)
        return adopted

    def _adopt_one(self, folder: Path, job_id: int, run: int) -> RunningJob:
        # (the folder's name is the run: job<ID>.<RUN>, in the daemon's own spool; earlier versions kept the
        # launched job beside it as well, job.pb, which nothing needs)
        herd = shepherding.adopt(folder, BATCH)
        group = fence.recorded_cgroup(folder)
        if group is not None:
            self.cgroups.adopt(job_id, group)
        running = RunningJob(job_id, run, herd, herd.pids.get(0, 0), cgroup=group, adopted=True)
        with self._lock:
            self.jobs[(job_id, run)] = running
            self._newest[job_id] = max(run, self._newest.get(job_id, -1))
        log.info("job %d: run %d adopted from an earlier airnoded (batch script pid %d, %s)", job_id, run,
                 running.pgid, "running" if not herd.ended else "ended meanwhile")
        return running

    def _kill_unwatched(self, folder: Path, job_id: int) -> None:
        """A run folder without a shepherd (left by a daemon that started jobs itself): kill its group."""
        try:
            pgid = int(jobfiles.read_root_file(folder, "pgid", 64))
        except (OSError, ValueError, jobfiles.UnsafeFile):
            return
        if pgid > 1 and _group_is_job(pgid, job_id):  # not a recycled process group
            killpg(pgid, signal.SIGKILL)
            log.warning("job %d: killed process group %d left by an earlier airnoded", job_id, pgid)

    def kill_leftover_cgroups(self, keep: set[tuple[int, int]]) -> None:
        """Kill and remove the cgroups of runs no one watches (neither adopted nor with steps here). One
        whose processes outlive the kill (an earlier daemon's leftover watch was on it) goes to this
        daemon's leftover watch (on_leftover), which drains the node if they stay stuck."""
        if not self.cgroups.enabled:
            return
        for group in self.cgroups.leftovers():
            key = jobfiles.parse_job_dir(group.name)
            if key in keep:
                continue
            if self.cgroups.kill(group):
                log.warning("%s: killed processes left in the cgroup by an earlier airnoded", group.name)
                time.sleep(0.1)
            self.cgroups.remove(group)
            if key is not None and group.exists():
                self.on_leftover(key[0], key[1], group)

    def signal(self, job_id: int, run: int, sig: int, grace_s: float, batch_only: bool = False) -> bool:
        """Send `sig` to this run's process group (or only its batch shell); sig 0 terminates: SIGTERM,
        then SIGKILL after grace. A signal for an older run never reaches a newer one; an older run
        found here is killed (it is stale)."""
        with self._lock:
            running = self.jobs.get((job_id, run))
            older = [r for (j, n), r in self.jobs.items() if j == job_id and n < run]
        for stale in older:
            self._kill_now(stale)
        if running is None:
            return False
        if sig and batch_only:   # the script's shell, if it still is the one its shepherd started
            if 0 not in running.herd.running() or start_time(running.pgid) != running.herd.starts.get(0):
                return False
            try:
                os.kill(running.pgid, sig)
            except ProcessLookupError:
                return False
            return True
        if sig:
            running.herd.kill_children(sig)
            return True
        running.killed = True
        running.herd.kill_children(signal.SIGTERM)
        threading.Thread(target=self._kill_after, args=(running, grace_s), daemon=True).start()
        return True

    def fence_run(self, job_id: int, run: int, kill_in: float) -> None:
        """The fence: SIGTERM now and SIGKILL in kill_in seconds (at once when 0)."""
        with self._lock:
            running = self.jobs.get((job_id, run))
        if running is None:
            return
        running.fenced = running.killed = True
        if not kill_in:
            self._kill_now(running)
            return
        running.herd.kill_children(signal.SIGTERM)
        threading.Thread(target=self._kill_after, args=(running, kill_in), daemon=True).start()

    def kill_run(self, job_id: int, run: int) -> bool:
        """SIGKILL a run the controller says is not its job's current one."""
        with self._lock:
            running = self.jobs.get((job_id, run))
        if running is not None:
            self._kill_now(running)
        return running is not None

    def abandon(self, job_id: int, run: int, detail: str) -> bool | None:
        """Give up a run whose processes outlive SIGKILL (see killwatch): report its end now, as killed,
        and stop reporting it; its watcher stays, to clean up should it ever end. True when given up,
        False when its script has just ended (its watcher reports that), None when it has none here."""
        with self._lock:
            running = self.jobs.get((job_id, run))
            if running is None:
                return None
            if running.done.is_set():
                return False
            del self.jobs[(job_id, run)]
            running.given_up = True
        fenced = running.fenced or fence.was_fenced(jobfiles.job_dir(self.spool, job_id, run))   # (still alive:
        self.on_exit(pb.JobExit(job_id=job_id, run=run, exit_signal=signal.SIGKILL, killed=True,   # any mark came
                                fenced=fenced, detail=detail))                                    # before its end)
        return True

    def kill_again(self, job_id: int, run: int) -> list[int]:
        """SIGKILL what is left of this run's batch script here once more (a few rounds through its group);
        the processes still there."""
        with self._lock:
            running = self.jobs.get((job_id, run))
        if running is None:
            return []
        running.herd.kill_children()
        if running.cgroup is None:
            return list(running.herd.running().values())
        self.cgroups.empty(running.cgroup, tries=3)
        return self.cgroups.pids(running.cgroup) + list(running.herd.running().values())

    def _kill_now(self, running: RunningJob) -> None:
        running.killed = True
        self.on_kill((running.job_id, running.run))
        running.herd.kill_children()
        if running.cgroup is not None:
            self.cgroups.kill(running.cgroup)

    def _kill_after(self, running: RunningJob, grace_s: float) -> None:
        if not running.done.wait(grace_s):
            self._kill_now(running)


def _group_is_job(pgid: int, job_id: int) -> bool:
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.environ().get("AIR_JOB_ID") == str(job_id):
                return True
        except (psutil.Error, ProcessLookupError):
            continue
    return False


def _wait_status(status: int) -> tuple[int, int]:
    """waitpid's raw status as (exit code, signal)."""
    if os.WIFSIGNALED(status):
        return 0, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), 0
