"""The scheduler's decisions on a real local cluster (2 nodes x 4 GPUs), as a new user would try
them: three held jobs released together, a preemptor that ranks below its victim, the priority
shown for held and running jobs (across a controller restart too), and a QOS configuration whose
preemption goes round in a cycle."""
import subprocess
import sys

from cluster import wait_for

EXTRA = """
[scheduler]
preempt_grace_s = 2.0
weight_qos = 100000

[[qos]]
name = "normal"

[[qos]]
name = "high"
priority = 10
preempt = ["normal"]
"""


# (node timeout 12 s: the nodes fence themselves at 6 s, longer than a controller restart takes on a busy host)
CLUSTER = dict(node_timeout=12.0, extra_config=EXTRA)


def _cancel_all(cluster):
    cluster.cli("aircancel", "-u", "root", check=False)
    wait_for(lambda: not cluster.queue("-t", "PD,R,CG"), timeout=30, what="the queue to empty")


def test_three_held_jobs_released_together_the_wide_one_runs_next_not_after_the_long_one(cluster):
    script = cluster.write_script("sleep.sh", "#!/bin/sh\nsleep 300\n")
    # A: 1 node, 1 h, highest; B: 2 nodes, next; C: 1 node, 10 h, lowest (nice lowers priority)
    a = cluster.submit(script, "-H", "--gpus-per-node=4", "-t", "1:00:00")
    b = cluster.submit(script, "-H", "--nodes=2", "--gpus-per-node=4", "-t", "1:00:00", "--nice=2000")
    c = cluster.submit(script, "-H", "--gpus-per-node=4", "-t", "10:00:00", "--nice=4000")
    cluster.cli("aircontrol", "release", str(a), str(b), str(c))
    cluster.wait_state(a, "RUNNING")
    wait_for(lambda: cluster.job(c)["reason"] == "Priority", timeout=10, what="C to wait behind B's reservation")
    assert cluster.job(b)["state"] == "PENDING" and cluster.job(c)["state"] == "PENDING"
    start = cluster.cli("airq", "--start", "-h").stdout
    assert str(b) in start
    # the priority the pass used shows for running and pending jobs alike
    shown = {j: int(cluster.cli("airq", "-j", str(j), "-h", "-o", "%Q").stdout.strip()) for j in (a, b, c)}
    assert shown[a] > shown[b] > shown[c] and shown[a] > 0
    assert f"Priority={shown[a]}" in cluster.cli("aircontrol", "show", "job", str(a)).stdout
    _cancel_all(cluster)


def test_a_preemptor_that_ranks_below_its_victim_does_not_preempt_it_and_says_why(cluster):
    script = cluster.write_script("sleep.sh", "#!/bin/sh\nsleep 300\n")
    # an operator (root) raised the victim's priority above anything the high QOS gives
    victims = [cluster.submit(script, "--gpus-per-node=4", "--nice=-500000") for _ in range(2)]
    for v in victims:
        cluster.wait_state(v, "RUNNING")
    boss = cluster.submit(script, "--gpus-per-node=4", "--qos=high")
    wait_for(lambda: "may not preempt job" in cluster.job(boss)["reason_detail"], timeout=10,
             what="the preemptor to say why it waits")
    assert "it ranks higher" in cluster.job(boss)["reason_detail"]
    assert all(cluster.job(v)["state"] == "RUNNING" for v in victims)
    assert cluster.job(boss)["state"] == "PENDING"
    _cancel_all(cluster)


def test_the_priority_shown_is_the_last_passes_for_a_held_job_alone_and_after_a_controller_restart(cluster):
    script = cluster.write_script("sleep.sh", "#!/bin/sh\nsleep 300\n")

    def shown(job_id):
        return int(cluster.cli("airq", "-j", str(job_id), "-h", "-t", "all", "-o", "%Q").stdout.strip())
    running = cluster.submit(script, "--gpus-per-node=4")    # started by the first pass that sees it
    cluster.wait_state(running, "RUNNING")
    before = shown(running)
    assert before > 0
    held = cluster.submit(script, "-H", "--gpus-per-node=4")   # the only job waiting: held
    wait_for(lambda: shown(held) > 0, timeout=15, what="a held job alone to show its priority")
    cluster.cli("aircancel", str(held))
    cluster.wait_state(held, "CANCELLED")
    cluster.kill_controller()   # nothing is pending: no pass works priorities out after the restart
    cluster.start_controller()
    after = shown(running)
    assert after > 0 and abs(after - before) <= 1, (before, after)   # (its age may add a point meanwhile)
    assert f"Priority={after}" in cluster.cli("aircontrol", "show", "job", str(running)).stdout
    _cancel_all(cluster)


def test_a_qos_cycle_is_refused_at_start_up_with_one_line(tmp_path):
    conf = tmp_path / "air.toml"
    conf.write_text(f"""
[controller]
auth = "none"
state_dir = "{tmp_path}"
address = "127.0.44.200:6817"

[[nodes]]
name = "n1"
address = "127.0.44.201"
gpus = "sim:1"

[[partitions]]
name = "p"
nodes = "n1"

[[qos]]
name = "normal"
preempt = ["high"]

[[qos]]
name = "high"
preempt = ["normal"]
""")
    proc = subprocess.run([sys.executable, "-m", "air.airctld", "--config", str(conf)], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and "preemption cycle: normal -> high -> normal" in proc.stderr
