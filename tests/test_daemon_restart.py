"""A node daemon restart keeps the node's jobs: `systemctl restart airnoded` (SIGTERM, then a new
daemon) and a crash (kill -9, then a new daemon) during a 2-node job with an airrun step. The run
goes on with no requeue, its step's ranks are followed again by airrun and every line arrives (but
those a crashed daemon was passing on); what ends while no daemon watches is reported with its real
exit; a run the controller no longer wants is killed. Checked from the processes and the job's output, not from the store alone."""
import shutil
import signal
import subprocess
import time

import psutil
import pytest

from cluster import wait_for



CLUSTER = dict(gpus_per_node=2, node_timeout=12.0)


def _pids_of(cluster, job_id: int) -> dict[int, str]:
    """pid -> AIR_RESTART_COUNT of every live process of the job (but the short sleeps its ranks run)."""
    out = {}
    for p, env in cluster.job_process_envs([job_id]):
        try:
            if p.name() != "sleep":
                out[p.pid] = env.get("AIR_RESTART_COUNT", "?")
        except psutil.Error:
            continue
    return out


def _restart(cluster, index: int, sig: int) -> None:
    cluster.kill_node(index, sig)
    time.sleep(0.5)
    cluster.start_node(index)


def _keepers(cluster, node: str) -> list[int]:
    spool = str((cluster.dir / "spool" / node).resolve())
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or []
        if any(arg.endswith("airnoded.fence") for arg in cmdline) and spool in cmdline:
            found.append(p.pid)
    return found


def test_daemon_restarts_keep_a_two_node_step_running(cluster):
    # each of 2 ranks per node prints a numbered line every 0.1 s for about 9 s
    script = cluster.write_script("steps.sh", "#!/bin/sh\n"
                                  "exec airrun --label sh -c 'i=0; while [ $i -lt 90 ]; do echo \"$RANK $i\"; "
                                  "i=$((i+1)); sleep 0.1; done'\n")
    job_id = cluster.submit(script, "-N", "2", "--gpus-per-node=2", "--ntasks-per-node=2")
    cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: len(_pids_of(cluster, job_id)) >= 5, what="the ranks to run")
    ranks_before = set(_pids_of(cluster, job_id))
    _restart(cluster, 1, signal.SIGTERM)          # node02: only ranks there (systemctl restart)
    time.sleep(2.0)
    _restart(cluster, 0, signal.SIGKILL)          # node01: the batch script and ranks (a crash)
    time.sleep(1.0)
    assert ranks_before <= set(_pids_of(cluster, job_id)), "a restart killed processes of the job"
    _restart(cluster, 1, signal.SIGTERM)          # node02 again, right after its adoption: it stops at once
    for name in ("node01", "node02"):             # each restart replaced its node's fence keeper
        assert len(_keepers(cluster, name)) == 1, (name, _keepers(cluster, name))
    job = cluster.wait_state(job_id, "COMPLETED", timeout=40)
    assert job["exit_code"] == 0 and job["restart_count"] == 0
    lines = (cluster.work / f"air-{job_id}.out").read_text().splitlines()
    for rank in range(4):
        got = [line.split(": ", 1)[1] for line in lines if line.startswith(f"{rank}: ")]
        every = [f"{rank} {i}" for i in range(90)]
        if rank >= 2:   # node02's daemon stopped cleanly, twice: it hands over everything it had read
            assert got == every, f"rank {rank}'s output: {got[:3]}...{got[-3:]}"
        else:   # node01's crashed: the lines it was passing on at that instant may be lost, nothing else
            assert got == sorted(set(got), key=every.index) and len(got) >= 88 and got[-1] == every[-1], \
                f"rank {rank}'s output: {got[:3]}...{got[-3:]} ({len(got)} lines)"
    log = (cluster.dir / "log" / "node01.log").read_text()
    assert f"job {job_id}: run 0 adopted from an earlier airnoded" in log


def test_a_script_that_ends_while_no_daemon_watches_reports_its_exit(cluster):
    script = cluster.write_script("ends.sh", "#!/bin/sh\nsleep 1.5 & wait\nexit 3\n")
    job_id = cluster.submit(script, "--gpus-per-node=1", "--no-requeue")
    job = cluster.wait_state(job_id, "RUNNING")
    index = int(job["nodes"][0][-2:]) - 1
    cluster.kill_node(index)
    wait_for(lambda: not _pids_of(cluster, job_id), timeout=10, what="the script to end while no daemon watches")
    cluster.start_node(index)
    job = cluster.wait_state(job_id, "FAILED", timeout=20)
    assert job["exit_code"] == 3 and job["reason"] != "JobLost"


def test_a_run_cancelled_while_its_daemon_was_away_is_killed_when_it_returns(cluster):
    script = cluster.write_script("long.sh", "#!/bin/sh\nsleep 60 & wait\n")
    job_id = cluster.submit(script, "--gpus-per-node=1", "--no-requeue")
    job = cluster.wait_state(job_id, "RUNNING")
    index = int(job["nodes"][0][-2:]) - 1
    wait_for(lambda: _pids_of(cluster, job_id), what="the script to run")
    cluster.kill_node(index)
    cluster.cli("aircancel", str(job_id))
    time.sleep(1.0)
    assert _pids_of(cluster, job_id), "the script should still run: no daemon is there to stop it"
    cluster.start_node(index)
    wait_for(lambda: not _pids_of(cluster, job_id), timeout=15, what="the cancelled run to be killed")
    assert cluster.wait_state(job_id, "CANCELLED", timeout=15)["state"] == "CANCELLED"


def test_a_host_crash_during_a_step_requeues_the_job(cluster):
    """Everything on node01 dies (daemon, job processes, shepherds): nothing there can say how the run
    ended, so the job is lost there and requeued, and its new run goes on from the start."""
    script = cluster.write_script("crash.sh", "#!/bin/sh\necho \"run $AIR_RESTART_COUNT\"\n"
                                  "[ \"$AIR_RESTART_COUNT\" = 0 ] && exec airrun python -c \"import time; time.sleep(60)\"\nexit 0\n")
    job_id = cluster.submit(script, "-N", "2", "--gpus-per-node=1", "--ntasks-per-node=1")
    cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: len(_pids_of(cluster, job_id)) >= 3, what="the step to run")
    cluster.crash_host(0, [job_id])
    cluster.start_node(0)
    job = cluster.wait_state(job_id, "COMPLETED", timeout=30)
    assert job["restart_count"] == 1 and job["last_stop_reason"] in ("JobLost", "NodeFail")
    assert "run 1" in (cluster.work / f"air-{job_id}.out").read_text()


def test_a_rank_that_fails_because_another_hosts_crash_took_its_peer_sends_the_job_back_to_the_queue(cluster):
    """node02 dies with its rank; rank 0 on node01 then fails as a collective does when its peer is gone
    (gloo: "Connection closed by peer"). airrun, on node01, holds that failure until node02 is given up:
    the step lost a node, so the job is requeued (and its next run completes), not FAILED."""
    mark, ready = cluster.work / "peer-gone", cluster.work / "peer-ready"
    ready.mkdir()
    script = cluster.write_script("peer.sh", "#!/bin/sh\necho \"run $AIR_RESTART_COUNT\"\n"
                                  "[ \"$AIR_RESTART_COUNT\" = 0 ] || exit 0\n"
                                  f"exec airrun sh -c 'touch {ready}/$SLURM_PROCID; if [ \"$SLURM_PROCID\" = 0 ]; then "
                                  f"while [ ! -e {mark} ]; do sleep 0.1; done; exit 1; fi; sleep 60; true'\n")
    job_id = cluster.submit(script, "-N", "2", "--gpus-per-node=1", "--ntasks-per-node=1")
    try:
        wait_for(lambda: len(list(ready.iterdir())) == 2, what="both ranks to run")
    except AssertionError:
        raise AssertionError((cluster.work / f"air-{job_id}.out").read_text()) from None
    cluster.crash_host(1, [job_id])
    mark.touch()   # rank 0's peer is gone: it fails
    def requeued_or_failed():
        job = cluster.job(job_id)
        return job if job["restart_count"] >= 1 or job["state"] == "FAILED" else None
    try:
        job = wait_for(requeued_or_failed, timeout=40, what="the job to be requeued (or to fail)")
    finally:
        cluster.start_node(1)
    assert job["state"] != "FAILED", f"the job failed: {job['reason']}"
    job = cluster.wait_state(job_id, "COMPLETED", timeout=60)
    assert job["restart_count"] == 1 and "run 1" in (cluster.work / f"air-{job_id}.out").read_text()


def test_an_exit_the_controller_has_not_heard_of_survives_a_daemon_restart(cluster):
    """An upgrade: the controller is down when the script ends, then the node daemon restarts; the exit
    it had not delivered is delivered by the next daemon, and the job is not run again."""
    script = cluster.write_script("quiet.sh", "#!/bin/sh\nsleep 2 & wait\necho \"done run $AIR_RESTART_COUNT\"\n")
    job_id = cluster.submit(script, "--gpus-per-node=1")
    job = cluster.wait_state(job_id, "RUNNING")
    index = int(job["nodes"][0][-2:]) - 1
    cluster.kill_controller()
    wait_for(lambda: not _pids_of(cluster, job_id), timeout=10, what="the script to end")
    _restart(cluster, index, signal.SIGTERM)
    time.sleep(1.0)
    cluster.start_controller()
    job = cluster.wait_state(job_id, "COMPLETED", timeout=20)
    assert job["restart_count"] == 0
    assert (cluster.work / f"air-{job_id}.out").read_text() == "done run 0\n"


def test_each_node_daemon_spreads_its_run_folders_over_the_filesystem(cluster):
    # the daemon marks its spool at start (ext4's TOPDIR flag, "T" to lsattr): see jobfiles.spread_runs
    for node in ("node01", "node02"):
        spool = cluster.dir / "spool" / node
        kind = subprocess.run(["stat", "-f", "-c", "%T", str(spool)], capture_output=True, text=True).stdout.strip()
        if kind != "ext2/ext3" or not shutil.which("lsattr"):
            pytest.skip(f"the spool is on {kind}, not ext4 (or lsattr is missing)")
        flags = subprocess.run(["lsattr", "-d", str(spool)], capture_output=True, text=True, check=True).stdout
        assert "T" in flags.split()[0], flags
