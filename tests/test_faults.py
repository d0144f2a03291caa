"""Crashes: airctld killed with -9 and restarted on the same store; an airnoded killed with -9 (and not
restarted: test_daemon_restart has the daemon that comes back)."""
import psutil

from cluster import wait_for

# nodes fence themselves after 6 s without airctld: longer than a restart takes here
CLUSTER = dict(node_timeout=12.0)


def _processes(cmdline: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []) == cmdline]


def test_controller_kill9_and_restart_keeps_every_job(cluster):
    runner = cluster.write_script("slow.sh", "#!/bin/sh\nsleep 4\necho finished\n")
    done = cluster.submit(cluster.write_script("fast.sh", "#!/bin/sh\necho fast\n"))
    cluster.wait_state(done, "COMPLETED")
    running = cluster.submit(runner, "--gpus-per-node=4", "-N", "2")
    cluster.wait_state(running, "RUNNING")
    pending = cluster.submit(runner, "--gpus-per-node=1")
    held = cluster.submit(runner, "-H")
    wait_for(lambda: cluster.job(pending)["reason"] == "Resources", what="pending reason")
    before = {j["job_id"]: j["state"] for j in cluster.queue()}
    assert before == {done: "COMPLETED", running: "RUNNING", pending: "PENDING", held: "PENDING"}

    cluster.kill_controller()
    proc = cluster.cli("airq", check=False)
    assert proc.returncode != 0 and proc.stderr.startswith(f"airq: error: cannot reach airctld at {cluster.controller}")
    cluster.start_controller()

    after = {j["job_id"]: j["state"] for j in cluster.queue()}
    assert set(after) == set(before)
    assert after[done] == "COMPLETED" and after[held] == "PENDING"
    # the running job kept running through the restart, finished, and was recorded
    job = cluster.wait_state(running, "COMPLETED", timeout=20)
    assert job["exit_code"] == 0 and (cluster.work / f"air-{running}.out").read_text() == "finished\n"
    cluster.wait_state(pending, "COMPLETED", timeout=20)
    newer = cluster.submit(runner, "-H")
    assert newer > max(before)
    cluster.cli("aircancel", str(held), str(newer))


def test_node_kill9_goes_down_and_its_job_ends_node_fail(cluster):
    script = cluster.write_script("stuck.sh", "#!/bin/sh\nsleep 120.25\n")
    job_id = cluster.submit(script, "-N", "2", "--gpus-per-node=1", "--no-requeue")
    job = cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: _processes("sleep 120.25"), what="the job's script to run")
    cluster.kill_node(1)  # node02: not the batch node, so only the gang's other half dies
    timeout = cluster.node_timeout
    job = cluster.wait_state(job_id, "NODE_FAIL", timeout=timeout + 5)
    assert job["reason"] == "NodeFail" and "node02" in job["reason_detail"]
    node = cluster.cli("aircontrol", "show", "node", "node02").stdout
    assert "State=DOWN" in node and "not responding" in node
    assert "down" in cluster.cli("airinfo", "-N", "-h", "-o", "%N %t").stdout.split("\n")[1]
    row = cluster.cli("airq", "-j", str(job_id), "-h", "-o", "%t %r").stdout.split()
    assert row == ["NF", "NodeFail"]
    # the batch script on the surviving node is killed, not left running
    wait_for(lambda: not _processes("sleep 120.25"), timeout=10, what="the job's script on node01 to be killed")
    # a job that needs both nodes now waits, and says why
    waiting = cluster.submit(script, "-N", "2")
    wait_for(lambda: cluster.job(waiting)["reason"] == "ReqNodeNotAvail", what="ReqNodeNotAvail")
    cluster.cli("aircancel", str(waiting))
