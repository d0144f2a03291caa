"""A run whose processes outlive SIGKILL (uninterruptible sleep: a hung file system or GPU driver)
is given up after unkillable_timeout_s, once every process left of it is in uninterruptible sleep:
its end is reported (killed; a requeued job starts its next run), and its node drains with Slurm's
reason, "Kill task failed", while the other jobs there run on. Uninterruptible sleep is made real with the
cgroup v1 freezer: a frozen process takes SIGKILL only once it is thawed (ps shows it in state D)."""
import contextlib
import os
import time
from pathlib import Path

import psutil
import pytest

from air.airnoded.killwatch import KillWatch
from cluster import LocalCluster, wait_for

FREEZER = Path("/sys/fs/cgroup/freezer")
UNKILLABLE_S = 3.0


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_run_is_due_once_it_has_outlived_sigkill_by_the_timeout_until_given_up():
    clock = Clock()
    watch = KillWatch(10.0, clock)
    watch.killed((1, 0))
    clock.now += 5
    watch.killed((1, 0))                 # a second SIGKILL does not restart the count
    watch.killed((2, 0))
    assert watch.due({(1, 0), (2, 0), (3, 0)}) == []
    clock.now += 5
    assert watch.due({(1, 0), (2, 0), (3, 0)}) == [(1, 0)]   # 10 s after its first SIGKILL
    assert watch.due({(1, 0), (2, 0), (3, 0)}) == [(1, 0)]   # again, until the agent gives it up
    assert watch.given_up() == set()
    watch.give_up((1, 0))
    watch.give_up((3, 0))                                     # (never killed: not given up)
    assert watch.given_up() == {(1, 0)} and watch.due({(1, 0), (2, 0), (3, 0)}) == []
    clock.now += 5
    assert watch.due({(2, 0)}) == [(2, 0)]                    # (1, 0) has ended meanwhile: forgotten
    assert watch.given_up() == set()
    assert watch.due(set()) == [] and watch.given_up() == set()
    never = KillWatch(0.0, clock)        # 0: never give up
    never.killed((1, 0))
    clock.now += 1e6
    assert never.due({(1, 0)}) == []


def test_a_run_that_ends_before_the_timeout_is_never_due():
    clock = Clock()
    watch = KillWatch(10.0, clock)
    watch.killed((1, 0))
    clock.now += 9
    assert watch.due({(1, 0)}) == []
    assert watch.due(set()) == []        # ended
    clock.now += 100
    assert watch.due({(1, 0)}) == []     # (the same key seen again, never killed again: nothing due)


def test_what_counts_as_stuck_by_process_state(monkeypatch):
    from air.airnoded import agent
    states = {1: psutil.STATUS_DISK_SLEEP, 2: psutil.STATUS_ZOMBIE, 3: None, 4: psutil.STATUS_SLEEPING,
              5: psutil.STATUS_RUNNING, 6: psutil.STATUS_STOPPED}
    monkeypatch.setattr(agent, "_state", states.get)
    assert agent._all_stuck([1]) and agent._all_stuck([1, 2, 3]) and agent._all_stuck([1, 1])
    for other in (4, 5, 6):
        assert not agent._all_stuck([1, other])   # something that may still run its code, or be woken
    assert not agent._all_stuck([]) and not agent._all_stuck([2, 3])   # nothing in uninterruptible sleep


@pytest.mark.skipif(os.geteuid() != 0 or not (FREEZER / "tasks").exists(), reason="needs root and the v1 freezer")
def test_only_processes_in_uninterruptible_sleep_count_as_stuck():
    import subprocess
    from air.airnoded.agent import _all_stuck
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not _all_stuck([]) and not _all_stuck([gone.pid])          # nothing left: nothing stuck
    sleeping = subprocess.Popen(["sleep", "60"])
    try:
        # (a process just started can be in uninterruptible sleep a moment, reading its program in)
        wait_for(lambda: psutil.Process(sleeping.pid).status() == psutil.STATUS_SLEEPING, what="sleep to sleep")
        assert not _all_stuck([sleeping.pid])                           # asleep, killable
        with _frozen([psutil.Process(sleeping.pid)]):
            sleeping.kill()
            assert _all_stuck([sleeping.pid]) and _all_stuck([sleeping.pid, gone.pid])
            assert not _all_stuck([sleeping.pid, os.getpid()])          # something still runs
    finally:
        sleeping.kill()
        sleeping.wait()


def _freezer_usable() -> bool:
    return os.geteuid() == 0 and (FREEZER / "tasks").exists()


CLUSTER = dict(node_timeout=6.0, options=("--unkillable-timeout", str(UNKILLABLE_S)))


@contextlib.contextmanager
def _frozen(procs: list[psutil.Process]):
    """The processes frozen (state D: SIGKILL waits until they are thawed) for the block, thawed after,
    and then dead of any SIGKILL sent meanwhile."""
    freezer = FREEZER / f"air-test-{os.getpid()}-{procs[0].pid}"
    freezer.mkdir()
    try:
        for p in procs:
            (freezer / "tasks").write_text(str(p.pid))
        (freezer / "freezer.state").write_text("FROZEN")
        wait_for(lambda: (freezer / "freezer.state").read_text().strip() == "FROZEN", what="the freeze")
        yield
    finally:
        (freezer / "freezer.state").write_text("THAWED")
        wait_for(lambda: not any(_state(p) not in ("gone", psutil.STATUS_ZOMBIE) for p in procs),
                 what="the thawed processes to die of their SIGKILL")
        for line in (freezer / "tasks").read_text().split():
            (FREEZER / "tasks").write_text(line)
        freezer.rmdir()


def _state(p: psutil.Process) -> str:
    try:
        return p.status()
    except psutil.NoSuchProcess:
        return "gone"


def _running_sleep(cluster, name: str, line: str) -> tuple[int, str, list[psutil.Process]]:
    """A running job whose script runs `line` (which starts a sleep) and waits: its id, its node, and
    its sleep processes."""
    job_id = cluster.submit(cluster.write_script(name, f"#!/bin/sh\n{line}\nwait\n"), "-G", "1")
    node = cluster.wait_state(job_id, "RUNNING")["nodes"][0]
    sleeps = wait_for(lambda: [p for p in cluster.job_processes([job_id]) if p.name() == "sleep"] or None,
                      what="the job's sleep")
    return job_id, node, sleeps


def _node(cluster, name):
    text = cluster.cli("aircontrol", "show", "node", name).stdout
    return dict(kv.split("=", 1) for kv in text.split() if "=" in kv and not kv.startswith("Gpu")), text


@pytest.mark.skipif(not _freezer_usable(), reason="needs root and the cgroup v1 freezer")
def test_a_run_stuck_after_sigkill_is_given_up_its_job_runs_again_and_its_node_drains(cluster, tmp_path):
    script = cluster.write_script("stuck.sh", "#!/bin/sh\necho \"start $AIR_RESTART_COUNT $AIR_NODENAME\"\n"
                                              "sleep 300 & wait\n")
    job_id = cluster.submit(script, "-G", "1", "-o", str(cluster.work / "stuck-%j.out"))
    first = cluster.wait_state(job_id, "RUNNING")["nodes"][0]
    other = cluster.submit(script, "-G", "1", "-w", first)   # a job beside it, which must run on
    cluster.wait_state(other, "RUNNING")
    procs = wait_for(lambda: len(p := cluster.job_processes([job_id])) >= 2 and p, what="the job's processes")
    with _frozen(procs):
        requeued_at = time.monotonic()
        cluster.cli("aircontrol", "requeue", str(job_id))
        # SIGTERM, SIGKILL kill_wait_s (5 s) later, given up UNKILLABLE_S after that: then the job
        # runs again, on the other node (its own is drained)
        job = wait_for(lambda: (j := cluster.job(job_id))["restart_count"] >= 1 and j["state"] == "RUNNING" and j,
                       timeout=30, what="the job's next run")
        waited = time.monotonic() - requeued_at
        assert job["nodes"] != [first]
        assert 5 + UNKILLABLE_S - 1 <= waited, waited   # not before its run was given up
        assert [_state(p) for p in procs] == [psutil.STATUS_DISK_SLEEP] * len(procs), procs   # still stuck
        shown, text = _node(cluster, first)
        assert shown["State"] in ("DRAIN", "DRNG"), text
        assert "Kill task failed" in text and f"job {job_id}" in text, text
        assert cluster.job(other)["state"] == "RUNNING"   # the drain ends no other job
        # a new job does not land on the drained node
        pinned = cluster.submit(script, "-G", "1", "-w", first)
        time.sleep(2)
        assert cluster.job(pinned)["state"] == "PENDING"
    out = (cluster.work / f"stuck-{job_id}.out").read_text()
    assert out.splitlines()[0] == f"start 0 {first}" and "start 1" in out, out
    # the operator resumes the node once the processes are gone, and it takes work again
    cluster.cli("aircontrol", "node", "resume", first)
    cluster.wait_state(pinned, "RUNNING")
    for j in (job_id, other, pinned):
        cluster.cli("aircancel", str(j))


@pytest.mark.skipif(not _freezer_usable(), reason="needs root and the cgroup v1 freezer")
def test_a_users_own_sigkill_to_stuck_steps_never_gives_up_a_run_whose_script_goes_on(cluster):
    """A signal a user sends to a job's steps (sbatch --signal=KILL@T, or the API) is not the daemon
    ending the run: a rank that outlives it is not given up while the batch script runs on (were it,
    the run would be reported ended while its script still ran)."""
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    job_id, node, ranks = _running_sleep(cluster, "steps.sh", "airrun -N 1 --ntasks-per-node=1 sleep 300 &")
    with _frozen(ranks):
        Client(str(cluster.config)).cancel(pb.CancelRequest(filter=pb.JobFilter(job_ids=[job_id]), signal=9,
                                                            steps_only=True))
        time.sleep(UNKILLABLE_S + 4)
        shown, text = _node(cluster, node)
        assert "DRAIN" not in shown["State"] and "DRNG" not in shown["State"], text
        job = cluster.job(job_id)
        assert job["state"] == "RUNNING" and job["restart_count"] == 0, job
    cluster.cli("aircancel", str(job_id), check=False)   # (the thawed rank died: airrun, then the script, end)
    cluster.wait_state(job_id, "CANCELLED", "COMPLETED", "FAILED")


@pytest.mark.skipif(not _freezer_usable(), reason="needs root and the cgroup v1 freezer")
def test_a_process_left_stuck_after_its_script_ended_drains_the_node(cluster):
    """The common case: the script's shell dies at once, a program it started (python in a driver) is
    stuck. The run ends as usual; what it left in its group outlives SIGKILL, and the node drains once
    it has for unkillable_timeout_s, so that the next job does not meet a GPU still held."""
    job_id, node, child = _running_sleep(cluster, "child.sh", "sleep 300 &")
    with _frozen(child):
        cluster.cli("aircancel", str(job_id))
        cluster.wait_state(job_id, "CANCELLED", timeout=20)   # the script's end is reported as usual
        shown, text = wait_for(lambda: "DR" in (n := _node(cluster, node))[0]["State"] and n, timeout=30,
                               what="the node to drain")
        assert "Kill task failed" in text and f"job {job_id} (run 0) left in uninterruptible sleep" in text, text
    cluster.cli("aircontrol", "node", "resume", node)


@pytest.mark.skipif(not _freezer_usable(), reason="needs root and the cgroup v1 freezer")
def test_a_restarted_daemon_still_drains_for_a_stuck_process_an_ended_run_left():
    """As above, with the node daemon killed and started again before the timeout: the new daemon finds
    the group it cannot empty and watches it as the earlier one did (it used to kill it once and
    forget it, and the node took jobs beside a process that may hold a GPU). Once drained for, the
    group is not drained for again by a daemon started after that (the operator resumed the node
    knowing of it): the spool keeps what was given up. A cluster of its own, with a timeout long enough
    that the earlier daemon surely dies before its watch would drain the node."""
    cluster = LocalCluster(nodes=1, gpus_per_node=4, options=("--unkillable-timeout", "10")).up()
    try:
        job_id, node, child = _running_sleep(cluster, "left.sh", "sleep 300 &")
        with _frozen(child):
            cluster.cli("aircancel", str(job_id))
            cluster.wait_state(job_id, "CANCELLED", timeout=20)
            # the run has ended here (its folder gone: a new daemon adopts nothing), and is not drained yet
            wait_for(lambda: not (cluster.dir / "spool" / node / f"job{job_id}.0").exists(), timeout=10,
                     what="the run's folder to go")
            assert "DR" not in _node(cluster, node)[0]["State"]
            cluster.kill_node(0)
            cluster.start_node(0)
            shown, text = wait_for(lambda: "DR" in (n := _node(cluster, node))[0]["State"] and n, timeout=40,
                                   what="the node to drain")
            assert "Kill task failed" in text and f"job {job_id} (run 0) left in uninterruptible sleep" in text, text
            log = (cluster.dir / "log" / f"{node}.log").read_text()
            assert log.count(f"job{job_id}.0: killed processes left in the cgroup by an earlier airnoded") == 1, log
            # the operator resumes the node knowing of them; a daemon started again does not drain it again
            record = cluster.dir / "spool" / node / "given-up"   # (written once the controller took the drain)
            wait_for(lambda: record.exists() and record.read_text() == f"{job_id} 0\n", timeout=10,
                     what="the record of the run given up")
            cluster.cli("aircontrol", "node", "resume", node)
            cluster.kill_node(0)
            cluster.start_node(0)
            wait_for(lambda: "given up by an earlier airnoded" in (cluster.dir / "log" / f"{node}.log").read_text(),
                     timeout=20, what="the new daemon to find the group")
            time.sleep(10 + 6)   # past the unkillable timeout of the new daemon's watch, and a heartbeat
            assert "DR" not in _node(cluster, node)[0]["State"], _node(cluster, node)[1]
        # thawed, the processes die: the group goes, and with it the record
        wait_for(lambda: record.read_text() == "", timeout=20, what="the record to forget the run")
        assert "DR" not in _node(cluster, node)[0]["State"]
    finally:
        cluster.down()
