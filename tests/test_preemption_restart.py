"""Preemption across a controller crash, on a real local cluster: airctld is killed (-9) while a
victim is still stopping, and the restarted controller keeps the node held for the preemptor (no
higher-priority job takes it) and picks no second victim. And a preemptor held and released never
takes the same victim twice. The node timeout is long enough that the
nodes, which fence themselves at half of it, outlast the restart."""
from cluster import wait_for

GRACE = 20
EXTRA = f"""
[scheduler]
preempt_grace_s = {GRACE}.0
weight_qos = 100000

[[qos]]
name = "normal"

[[qos]]
name = "high"
priority = 10
preempt = ["normal"]

[[qos]]
name = "top"
priority = 20
"""


CLUSTER = dict(node_timeout=12.0, extra_config=EXTRA)


def test_a_preemptors_held_node_stays_held_across_a_controller_kill9_and_no_second_victim_is_chosen(cluster):
    # both running jobs ignore SIGTERM: a victim stops only at its grace's SIGKILL, after the restart
    stubborn = cluster.write_script("stubborn.sh", "#!/bin/sh\ntrap '' TERM\nsleep 300\n")
    whole = ("--gpus-per-node=4", "-t", "60")
    running = [cluster.submit(stubborn, *whole) for _ in range(2)]
    for job_id in running:
        cluster.wait_state(job_id, "RUNNING")
    boss = cluster.submit(stubborn, *whole, "--qos=high")
    victim = wait_for(lambda: next((j for j in running if cluster.job(j)["state"] == "COMPLETING"), None),
                      what="a victim to be stopping")
    bystander = next(j for j in running if j != victim)
    held = cluster.job(victim)["nodes"]
    # ranks above the preemptor, asks for a whole node, may preempt nobody: only the hold keeps it off
    # the victim's node once that is free (without it, the preemptor would look for another victim)
    top = cluster.submit(stubborn, *whole, "--qos=top")
    wait_for(lambda: cluster.job(top)["reason"] not in ("None", ""), what="a pass to look at the top job")
    assert cluster.job(victim)["state"] == "COMPLETING"   # still within its grace
    cluster.kill_controller()
    cluster.start_controller()
    assert cluster.job(victim)["state"] == "COMPLETING", "the restart outlasted the grace: the test proves nothing"
    job = cluster.wait_state(boss, "RUNNING", timeout=GRACE + 20)
    assert job["nodes"] == held
    assert cluster.job(top)["state"] == "PENDING"
    job = cluster.job(bystander)
    assert job["state"] == "RUNNING" and job["restart_count"] == 0, job
    assert cluster.job(victim)["restart_count"] == 1
    cluster.cli("aircancel", "-u", "root", check=False)


def test_a_preemptor_held_and_released_never_preempts_the_same_job_again(cluster):
    """A user holds their preemptor while its victim stops, the victim runs again on the nodes the
    hold no longer keeps, and the preemptor is released: it does not take the same job a second
    time (a user could otherwise keep killing another user's job by holding and releasing)."""
    cluster.cli("aircancel", "-u", "root", check=False)
    wait_for(lambda: not cluster.queue("-t", "PD,R,CG"), timeout=40, what="the queue to empty")
    stubborn = cluster.write_script("stubborn.sh", "#!/bin/sh\ntrap '' TERM\nsleep 300\n")
    both = ("--nodes=2", "--gpus-per-node=4", "-t", "60")   # the victim has the whole cluster
    victim = cluster.submit(stubborn, *both)
    cluster.wait_state(victim, "RUNNING")
    boss = cluster.submit(stubborn, *both, "--qos=high")
    cluster.wait_state(victim, "COMPLETING")
    cluster.cli("aircontrol", "hold", str(boss))
    job = wait_for(lambda: (j := cluster.job(victim))["state"] == "RUNNING" and j["restart_count"] == 1 and j,
                   timeout=GRACE + 30, what="the victim to run again while the preemptor is held")
    cluster.cli("aircontrol", "release", str(boss))
    wait_for(lambda: cluster.job(boss)["reason"] not in ("JobHeldUser", "None", ""), timeout=15,
             what="a pass to look at the released preemptor")
    import time
    time.sleep(3)   # passes go on
    job = cluster.job(victim)
    assert job["state"] == "RUNNING" and job["restart_count"] == 1, job
    assert cluster.job(boss)["state"] == "PENDING"
    cluster.cli("aircancel", "-u", "root", check=False)
