"""A job never runs twice: a node that loses the controller fences itself before the controller
starts its jobs elsewhere, even when its daemon is frozen; runs are numbered and a stale run is
killed, never mistaken for the current one. Checked from the processes, not from the store."""
import os
import signal
import sqlite3
import threading
import time

import psutil
import pytest

from air.airnoded.launcher import Launcher, StaleRun
from cluster import LocalCluster, job_process_envs, job_processes, wait_for
from air.protos import air_pb2 as pb



CLUSTER = dict(node_timeout=6.0)   # (the fence's timings below are this timeout's)


class Runs:
    """Samples the processes of one job and records which runs were alive together."""

    def __init__(self, job_id: int, cluster: LocalCluster):
        self.job_id = str(job_id)
        self.spool = cluster.dir / "spool"   # this cluster's job (others count from 1 too)
        self.overlaps: list[set[str]] = []
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def alive(self) -> set[str]:
        return {env.get("AIR_RESTART_COUNT", "?") for _, env in job_process_envs(self.spool, [self.job_id])}

    def _watch(self):
        while not self._stop.is_set():
            runs = self.alive()
            self.seen |= runs
            if len(runs) > 1:
                self.overlaps.append(runs)
            time.sleep(0.05)


def _script(cluster, name, ignore_term=False):
    """A job that says when it starts and stops; with ignore_term, one that only SIGKILL ends."""
    on_term = "trap '' TERM" if ignore_term else "trap 'echo \"stop $AIR_RESTART_COUNT\"; exit 143' TERM"
    return cluster.write_script(name, "#!/bin/sh\necho \"start $AIR_RESTART_COUNT $AIR_NODENAME\"\n"
                                      f"{on_term}\nsleep 60 & wait\nwait\n")


def _lease(cluster, node) -> float:
    return float((cluster.dir / "spool" / node / "lease").read_text())


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _daemon(cluster, node: str) -> psutil.Process:
    return psutil.Process(cluster.pids[1 + int(node[-2:]) - 1])


def _node_events(cluster, node: str, signal: str) -> list[dict]:
    """The node's health history as the controller stored it."""
    conn = sqlite3.connect(cluster.dir / "state" / "air.db")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM node_events WHERE node = ? AND signal = ?",
                                              (node, signal))]
    finally:
        conn.close()


def test_a_frozen_node_daemon_never_leaves_two_runs_of_a_job(cluster):
    job_id = cluster.submit(_script(cluster, "frozen.sh"), "--gpus-per-node=4")
    first = cluster.wait_state(job_id, "RUNNING")["nodes"][0]
    wait_for(lambda: "start 0" in (cluster.work / f"air-{job_id}.out").read_text(), what="run 0 to start")
    daemon = _daemon(cluster, first)
    with Runs(job_id, cluster) as runs:
        daemon.suspend()        # a hung daemon: its job's processes run on, the keeper does not freeze
        try:
            job = wait_for(lambda: (j := cluster.job(job_id))["restart_count"] >= 1 and j["state"] == "RUNNING"
                           and j, timeout=30, what="the job to run again on the other node")
            assert job["nodes"] != [first] and job["last_stop_reason"] == "NodeFail"
            wait_for(lambda: "start 1" in (cluster.work / f"air-{job_id}.out").read_text(), what="run 1")
        finally:
            daemon.resume()
        time.sleep(3)           # the daemon wakes, checks its lease, beats again
    assert runs.overlaps == [], f"two runs of the job were alive at once: {runs.overlaps[:3]}"
    assert runs.seen == {"0", "1"}
    # the keeper fenced for the frozen daemon, which says so once it hears from the controller again
    wait_for(lambda: any("the fence keeper stopped runs " + f"{job_id}.0" in e["message"]
                         for e in _node_events(cluster, first, "fenced")), timeout=10,
             what="the keeper's fence in the node's health history")
    lines = (cluster.work / f"air-{job_id}.out").read_text().splitlines()
    assert lines.index("stop 0") < lines.index(f"start 1 {job['nodes'][0]}")   # run 0 ended before run 1 began
    assert cluster.job(job_id)["state"] == "RUNNING" and cluster.job(job_id)["restart_count"] == 1
    cluster.cli("aircancel", str(job_id))
    cluster.wait_state(job_id, "CANCELLED")


def test_a_job_that_ignores_sigterm_is_killed_before_the_controller_may_start_it_again(cluster):
    job_id = cluster.submit(_script(cluster, "stubborn.sh", ignore_term=True), "--gpus-per-node=4")
    node = cluster.wait_state(job_id, "RUNNING")["nodes"][0]
    wait_for(lambda: "start 0" in (cluster.work / f"air-{job_id}.out").read_text(), what="run 0 to start")
    daemon = _daemon(cluster, node)
    runs = Runs(job_id, cluster)
    assert runs.alive() == {"0"}
    daemon.suspend()
    try:
        lease = _lease(cluster, node)   # the keeper's view: the last renewal before the freeze
        wait_for(lambda: not runs.alive(), timeout=15, what="the keeper to kill the job")
        gone = _boottime()
    finally:
        daemon.resume()
    cc_after, cc_grace = 3.0, 1.5       # this cluster: node timeout 6 s, fence at half, SIGKILL half-way on
    # (1.0: the keeper looks 5 times a second, and the scan above of the host's processes takes its time,
    # longer while another test's cluster runs beside this one)
    assert gone - lease < cc_after + cc_grace + 1.0, gone - lease
    assert gone - lease < 6.0                                         # before the node timeout
    cluster.cli("aircancel", str(job_id))


def test_a_node_that_loses_the_controller_stops_its_jobs_and_says_so(cluster):
    job_id = cluster.submit(_script(cluster, "cut.sh"), "--gpus-per-node=4")
    node = cluster.wait_state(job_id, "RUNNING")["nodes"][0]
    wait_for(lambda: "start 0" in (cluster.work / f"air-{job_id}.out").read_text(), what="run 0 to start")
    controller = psutil.Process(cluster.pids[0])
    runs = Runs(job_id, cluster)   # (looked at here only: no sampling thread)
    assert runs.alive() == {"0"}
    controller.suspend()    # every node hears nothing from it, as if cut off
    try:
        began = time.monotonic()
        wait_for(lambda: not runs.alive(), timeout=10, what="the node to stop the job's processes")
        stopped_after = time.monotonic() - began
    finally:
        controller.resume()
    assert stopped_after < 6.0                  # fenced before the controller's node timeout
    assert "stop 0" in (cluster.work / f"air-{job_id}.out").read_text()   # SIGTERM first: a chance to checkpoint
    log = (cluster.dir / "log" / f"{node}.log").read_text()
    assert "fenced: no word from the controller for" in log
    job = wait_for(lambda: (j := cluster.job(job_id))["restart_count"] >= 1 and j, timeout=20,
                   what="the job to be requeued")
    assert job["last_stop_reason"] == "NodeFail"

    wait_for(lambda: _node_events(cluster, node, "fenced"), timeout=10, what="the fence in the node's health history")
    cluster.cli("aircancel", str(job_id))
    cluster.wait_state(job_id, "CANCELLED")


def test_airrun_says_its_step_lost_a_node_whose_fence_stopped_its_rank(cluster):
    # the node daemon is alive and streams the rank's end, but its own fence ended the rank: airrun ends
    # with the code of a lost node (the step did not fail) and one line that says why
    import subprocess
    from cluster import BIN
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", AIR_CONF=str(cluster.config), AIR_JOB_ID="")
    proc = subprocess.Popen([str(BIN / "airrun"), "-N", "1", "-w", "node02", "sleep", "77.25"], env=env,
                            cwd=str(cluster.work), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ranks():
        return [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or []) == ["sleep", "77.25"]]
    try:
        wait_for(ranks, timeout=30, what="the rank on node02")
        controller = psutil.Process(cluster.pids[0])
        controller.suspend()    # node02 hears nothing from the controller and fences itself; airrun hears node02
        try:
            wait_for(lambda: not ranks(), timeout=10, what="node02's fence to stop the rank")
        finally:
            controller.resume()
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 76, err   # (ExitCode.NODE_LOST)
    assert "node02: rank 0 was stopped by its node's fence" in err, err


def test_a_stale_runs_exit_never_ends_the_new_run(cluster):
    """Run 0 is frozen (with its node's daemon) past the node timeout; run 1 starts elsewhere; when the
    node wakes, run 0's end reaches the controller, which must not take it for run 1's."""
    job_id = cluster.submit(cluster.write_script("stale.sh", "#!/bin/sh\necho \"start $AIR_RESTART_COUNT\"\n"
                                                             "sleep 60\n"), "--gpus-per-node=4")
    first = cluster.wait_state(job_id, "RUNNING")["nodes"][0]
    wait_for(lambda: "start 0" in (cluster.work / f"air-{job_id}.out").read_text(), what="run 0 to start")
    daemon = _daemon(cluster, first)
    daemon.suspend()
    try:
        wait_for(lambda: cluster.job(job_id)["restart_count"] >= 1 and cluster.job(job_id)["state"] == "RUNNING",
                 timeout=30, what="run 1")
    finally:
        daemon.resume()
    time.sleep(4)   # run 0's exit (fenced, SIGTERM) is reported by the woken daemon
    job = cluster.job(job_id)
    assert job["state"] == "RUNNING" and job["restart_count"] == 1
    cluster.cli("aircancel", str(job_id))
    cluster.wait_state(job_id, "CANCELLED")


def _job(workdir, script: str, job_id: int = 5, run: int = 0) -> pb.Job:
    """A one-node batch job of this user's, as a launch carries it to n1."""
    return pb.Job(job_id=job_id, uid=os.getuid(), gid=os.getgid(), restart_count=run,
                  request=pb.JobRequest(script=f"#!/bin/sh\n{script}\n", workdir=str(workdir)),
                  allocation=[pb.NodeAlloc(node="n1")])


def _spool_and_launcher(tmp_path):
    """A node's spool (root's, as airnoded keeps it) and a launcher on it: (spool, exits, launcher),
    `exits` being what it reports."""
    os.chmod(tmp_path, 0o755)
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o755)
    exits = []
    return spool, exits, Launcher("n1", spool, exits.append)


def test_a_node_refuses_a_launch_of_an_older_run_and_kills_an_older_run_it_finds(tmp_path):
    _, exits, launcher = _spool_and_launcher(tmp_path)

    def job(run):
        return _job(tmp_path, "sleep 30", run=run)
    launcher.launch(job(1))
    assert launcher.runs() == [(5, 1)]
    with pytest.raises(StaleRun, match="run 0 of job 5 is older than run 1"):
        launcher.launch(job(0))
    launcher.launch(job(2))      # run 1 is stale now: killed as run 2 starts
    wait_for(lambda: [(e.run, e.killed) for e in exits] == [(1, True)], timeout=10, what="run 1's end")
    assert launcher.runs() == [(5, 2)]
    assert launcher.signal(5, 1, signal.SIGTERM, 1.0) is False    # a late signal for run 1 spares run 2
    assert launcher.runs() == [(5, 2)]
    launcher.kill_run(5, 2)
    wait_for(lambda: len(exits) == 2, timeout=10, what="run 2's end")


def test_a_retried_launch_of_a_run_that_has_ended_never_starts_it_again(tmp_path):
    """The controller retries a launch whose answer was lost; the first try may have run the script to
    its end already, before this daemon or after it restarted (the run's folder stays until the
    controller has its exit)."""
    spool, exits, launcher = _spool_and_launcher(tmp_path)
    marker = tmp_path / "ran"
    job = _job(tmp_path, f"echo ran >> {marker}")
    launcher.launch(job)
    wait_for(lambda: len(exits) == 1, timeout=10, what="run 0's end")
    launcher.launch(job)                                   # the retry
    successor = Launcher("n1", spool, exits.append)        # a daemon restarted before the exit was taken
    assert successor.adopt() == [(5, 0)]
    wait_for(lambda: len(exits) == 2, timeout=10, what="run 0's end, found by the successor")
    successor.launch(job)
    time.sleep(1.0)                                        # (long enough for a script started again to write)
    assert marker.read_text() == "ran\n" and launcher.runs() == successor.runs() == []
    assert [(e.job_id, e.run, e.exit_code) for e in exits] == [(5, 0, 0)] * 2


def test_a_local_cluster_taken_down_leaves_no_job_running():
    """A node daemon that stops leaves its jobs for the next one (a restart keeps them); a local cluster
    taken down has no next one, so `aircontrol local down` kills them."""
    c = LocalCluster(nodes=2, gpus_per_node=4).up()
    try:
        job_id = c.submit(c.write_script("left.sh", "#!/bin/sh\nsleep 300 &\nairrun -N 2 sleep 300\n"),
                          "-N", "2", "--gpus-per-node=1")
        c.wait_state(job_id, "RUNNING")

        def alive():   # (every job's)
            return job_processes(c.dir / "spool", None)
        wait_for(lambda: len(alive()) >= 4, what="the batch script and a rank on each node")
    finally:
        c.down()
    wait_for(lambda: not alive(), timeout=5, what="the job's processes to be gone")


def test_the_keeper_finds_nothing_to_stop_in_a_spool_that_is_gone(tmp_path):
    """A local cluster removed while its keeper looks (or `--kill-runs` after it): no traceback."""
    from air.airnoded import fence
    assert fence.stop_runs(tmp_path / "gone", signal.SIGKILL) == []
    assert fence.main(["--kill-runs", str(tmp_path / "gone")]) == 0


def test_a_fenced_node_starts_no_launch_or_step_that_arrives_late():
    """A launch or a step sent before the node fenced itself, and taken after (a daemon frozen with the
    request in its socket, a slow network), is answered as not reached: the controller tries again and
    then requeues, airrun follows again and then gives the node up."""
    from types import SimpleNamespace

    import grpc

    from air.airnoded import agent as module
    from air.protos.credential import Identity

    class Aborted(Exception):
        pass

    class Context:
        def time_remaining(self):
            return 5.0

        def abort(self, code, details):
            raise Aborted(code, details)

    started = []
    controller = SimpleNamespace(fence_after_s=5.5, service_uid=lambda: 0)
    agent = module.Agent.__new__(module.Agent)
    agent.config, agent.node = SimpleNamespace(controller=controller), SimpleNamespace(name="n1")
    agent.auth = SimpleNamespace(identify=lambda *a: Identity(0, 0))
    agent.launcher = SimpleNamespace(launch=started.append)
    agent.steps = SimpleNamespace(run=lambda *a, **k: started.append(a), attach=lambda *a, **k: started.append(a))
    service = module.AgentService(agent)
    job = pb.Job(job_id=5, restart_count=0)
    agent._lease = module.lease_clock() - 2.0      # answered 2 s ago: not fenced
    assert agent.fenced() == ""
    service.Launch(pb.LaunchRequest(job=job, batch=True), Context())
    assert started == [job]
    agent._lease = module.lease_clock() - 6.0      # past the fence time
    with pytest.raises(Aborted) as e:
        service.Launch(pb.LaunchRequest(job=job, batch=True), Context())
    assert e.value.args[0] == grpc.StatusCode.UNAVAILABLE and "n1 is fenced: no word from the controller" in \
        e.value.args[1]
    with pytest.raises(Aborted) as e:
        next(iter(service.RunStep(pb.RunStepRequest(job_id=5, step_id=0), Context())))
    assert e.value.args[0] == grpc.StatusCode.UNAVAILABLE
    assert started == [job]


def test_the_keeper_fences_only_runs_with_something_alive_and_records_them_once(tmp_path):
    """A script that ends while its daemon is frozen past the fence time keeps its own exit: the
    keeper marks, signals and records only runs with something alive (a run marked fenced is
    reported as the node's failure, and requeued)."""
    from air.airnoded import fence, jobfiles
    spool, exits, launcher = _spool_and_launcher(tmp_path)

    def job(job_id, script):
        return _job(tmp_path, script, job_id)
    launcher.launch(job(5, "exit 3"))
    wait_for(lambda: exits, timeout=10, what="job 5's end")
    launcher.launch(job(6, "sleep 30"))
    first: list[str] = []
    assert fence.stop_runs(spool, signal.SIGTERM, first=first) == first == ["job6.0"]
    assert not fence.was_fenced(jobfiles.job_dir(spool, 5, 0)) and fence.was_fenced(jobfiles.job_dir(spool, 6, 0))
    assert fence.stop_runs(spool, signal.SIGTERM, first=first) in ([], ["job6.0"]) and first == ["job6.0"]
    wait_for(lambda: len(exits) == 2, timeout=10, what="job 6's end")
    assert [(e.job_id, e.exit_code, e.fenced) for e in exits] == [(5, 3, False), (6, 0, True)], exits
    fence.record_keeper_fence(spool, 6.5, first)
    fence.record_keeper_fence(spool, 7.0, ["job7.2", "not-a-run"])
    assert fence.take_keeper_fences(spool) == [(6.5, [(6, 0)]), (7.0, [(7, 2)])]
    assert fence.take_keeper_fences(spool) == []   # (each taken once)


def test_a_run_that_ended_before_a_fence_marked_it_reports_its_own_exit(tmp_path):
    """A script that ends while its daemon is frozen or down, and a fence that marks its run after
    that (the daemon's on waking, or the keeper's for processes the script left behind): the run's
    result is its own exit, not the node's failure (which would requeue a finished job and run it
    again). A run the fence marked while it ran ends as the fence's."""
    from air.airnoded import fence, jobfiles
    spool, exits, launcher = _spool_and_launcher(tmp_path)

    def job(job_id, script):
        return _job(tmp_path, script, job_id)
    launcher.launch(job(5, "exit 3"))
    wait_for(lambda: exits, timeout=10, what="job 5's end")
    time.sleep(0.05)                                       # (a later tick of the kernel's file clock)
    fence.mark_fenced(jobfiles.job_dir(spool, 5, 0))       # a fence that came after the end
    successor = Launcher("n1", spool, exits.append)        # the daemon, started again before the exit was taken
    assert successor.adopt() == [(5, 0)]
    wait_for(lambda: len(exits) == 2, timeout=10, what="job 5's end, found by the successor")
    launcher.launch(job(6, "sleep 30"))
    wait_for(lambda: launcher.runs() == [(6, 0)], timeout=10, what="job 6 to start")
    assert fence.mark_fenced(jobfiles.job_dir(spool, 6, 0))   # the fence, as it stops a running script
    launcher.fence_run(6, 0, 0)
    wait_for(lambda: len(exits) == 3, timeout=10, what="job 6's end")
    time.sleep(0.05)
    assert not fence.mark_fenced(jobfiles.job_dir(spool, 6, 0))   # marked again later (the keeper's next
    third = Launcher("n1", spool, exits.append)                   # round): the first mark counts
    assert sorted(third.adopt()) == [(5, 0), (6, 0)]
    wait_for(lambda: len(exits) == 5, timeout=10, what="both ends, found by a third daemon")
    assert [(e.job_id, e.exit_code, e.fenced) for e in exits[:3]] == [(5, 3, False), (5, 3, False), (6, 0, True)]
    assert sorted((e.job_id, e.exit_code, e.fenced) for e in exits[3:]) == [(5, 3, False), (6, 0, True)]
