"""Scheduling policy on a real local cluster: preemption, dependencies, arrays, limits, priority
and fairshare views, the time-limit warning."""
import time

from cluster import wait_for

EXTRA = """
[scheduler]
preempt_grace_s = 2.0
weight_qos = 100000

[[qos]]
name = "normal"
max_gpus_per_user = 6

[[qos]]
name = "high"
priority = 10
preempt = ["normal"]

[[accounts]]
name = "ml"
users = ["root", "nobody"]
shares = 3

[[accounts]]
name = "bio"
users = ["root"]
shares = 1
max_gpus = 4
"""


CLUSTER = dict(extra_config=EXTRA)


def _sleeper(cluster, name="sleeper.sh"):
    return cluster.write_script(name, "#!/bin/sh\nsleep 300\n")


def _cancel_all(cluster):
    cluster.cli("aircancel", "-u", "root", check=False)
    cluster.cli("aircancel", "-u", "nobody", check=False)
    wait_for(lambda: not cluster.queue("-t", "PD,R,CG"), timeout=30, what="the queue to empty")


def test_preemption_requeues_or_ends_the_victims_and_starts_the_preemptor_within_seconds(cluster):
    script = _sleeper(cluster)
    victim = cluster.submit(script, "--gpus-per-node=4", "-A", "ml")
    stuck = cluster.submit(script, "--gpus-per-node=4", "-A", "ml", "--no-requeue", user="nobody")
    cluster.wait_state(victim, "RUNNING")
    cluster.wait_state(stuck, "RUNNING")
    began = time.monotonic()
    boss = cluster.submit(script, "--nodes=2", "--gpus-per-node=4", "--qos=high", "-A", "ml")
    cluster.wait_state(boss, "RUNNING", timeout=20)
    assert time.monotonic() - began < 10
    job = cluster.job(victim)
    assert job["state"] == "PENDING" and job["restart_count"] == 1 and job["last_stop_reason"] == "Preempted"
    job = cluster.job(stuck)
    assert job["state"] == "PREEMPTED" and job["reason"] == "Preempted" and "by job" in job["reason_detail"]
    assert cluster.cli("airq", "-j", str(stuck), "-h", "-t", "all", "-o", "%t").stdout.strip() == "PR"
    _cancel_all(cluster)


def test_dependency_chain_runs_in_order_and_a_broken_one_says_so(cluster):
    log = cluster.work / "chain.log"
    steps = []
    for i in range(3):   # the first runs long enough that the last is surely submitted before it ends
        script = cluster.write_script(f"chain{i}.sh", f"#!/bin/sh\nsleep {5 if i == 0 else 0.5}\necho {i} >> {log}\n")
        after = ["--dependency", f"afterok:{steps[-1]}"] if steps else []
        steps.append(cluster.submit(script, *after))
    wait_for(lambda: cluster.job(steps[2])["reason"] == "Dependency", timeout=5, what="the last to wait, saying why")
    cluster.wait_state(steps[2], "COMPLETED", timeout=30)
    assert log.read_text().split() == ["0", "1", "2"]
    fails = cluster.submit(cluster.write_script("fails.sh", "#!/bin/sh\nexit 3\n"))
    never = cluster.submit(_sleeper(cluster), f"--dependency=afterok:{fails}")
    either = cluster.submit(cluster.write_script("either.sh", "#!/bin/sh\ntrue\n"),
                            f"--dependency=afterok:{fails}?afternotok:{fails}")
    wait_for(lambda: cluster.job(never)["reason"] == "DependencyNeverSatisfied", timeout=20,
             what="the dependency to be seen as never satisfied")
    assert cluster.job(never)["state"] == "PENDING"
    cluster.wait_state(either, "COMPLETED", timeout=20)
    bad = cluster.cli("airbatch", "--dependency=afterok:999999", str(_sleeper(cluster)), check=False)
    assert bad.returncode == 1 and "job 999999, which does not exist" in bad.stderr
    bad = cluster.cli("airbatch", "--dependency=afterwards:1", str(_sleeper(cluster)), check=False)
    assert bad.returncode == 1 and "must be one of" in bad.stderr and bad.stderr.count("\n") == 1
    _cancel_all(cluster)


def test_array_with_throttle_never_runs_more_than_n_and_tasks_know_their_index(cluster):
    marks = cluster.work / "marks"
    marks.mkdir()
    script = cluster.write_script("task.sh", f"#!/bin/sh\ndate +%s.%N > {marks}/$AIR_ARRAY_TASK_ID.start\n"
                                  f"echo $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID\nsleep 1\n"
                                  f"date +%s.%N > {marks}/$AIR_ARRAY_TASK_ID.end\n")
    array = cluster.submit(script, "--array=0-5%2", "-o", "arr-%A_%a.out")
    compact = cluster.cli("airq", "-h", "-o", "%i %t").stdout
    assert f"{array}_[" in compact and "%2]" in compact
    # (the shell makes each file before date writes into it: wait for what they say)
    wait_for(lambda: sum(1 for f in marks.glob("*.end") if f.read_text().strip()) == 6, timeout=60,
             what="all six tasks to finish")
    spans = [(float((marks / f"{i}.start").read_text()), float((marks / f"{i}.end").read_text())) for i in range(6)]
    for t, _ in spans:   # at any task's start, at most two tasks (itself included) are running
        assert sum(1 for s, e in spans if s <= t < e) <= 2
    for i in range(6):
        assert (cluster.work / f"arr-{array}_{i}.out").read_text().split() == [str(array), str(i)]
    tasks = cluster.queue("-j", str(array), "-t", "all", "-r")
    assert sorted(t["array_task_id"] for t in tasks) == list(range(6))
    # one task of an array can be cancelled alone
    other = cluster.submit(_sleeper(cluster), "--array=0-3", "--hold")
    cluster.cli("aircancel", f"{other}_2")
    states = {t["array_task_id"]: t["state"] for t in cluster.queue("-j", str(other), "-t", "all", "-r")}
    assert states == {0: "PENDING", 1: "PENDING", 2: "CANCELLED", 3: "PENDING"}
    cluster.cli("aircancel", str(other))
    assert {t["state"] for t in cluster.queue("-j", str(other), "-t", "all", "-r")} == {"CANCELLED"}


def test_limits_wait_with_their_reason_or_are_refused_at_submit(cluster):
    script = _sleeper(cluster)
    first = cluster.submit(script, "--gpus-per-node=4", "-A", "ml")
    cluster.wait_state(first, "RUNNING")
    over_user = cluster.submit(script, "--gpus-per-node=4", "-A", "ml")   # 8 > QOS normal's 6 per user
    wait_for(lambda: cluster.job(over_user)["reason"] == "QOSMaxGPUPerUser", timeout=10, what="the QOS reason")
    refused = cluster.cli("airbatch", "--nodes=2", "--gpus-per-node=4", "-A", "ml", str(script), check=False)
    assert refused.returncode == 1 and "QOS normal allows 6 per user" in refused.stderr
    refused = cluster.cli("airbatch", "--nodes=2", "--gpus-per-node=3", "-A", "bio", "--qos=high", str(script),
                          check=False)
    assert refused.returncode == 1 and "account bio has a quota of 4 GPUs" in refused.stderr
    refused = cluster.cli("airbatch", "--qos=gold", str(script), check=False)
    assert refused.returncode == 1 and "QOS 'gold' does not exist" in refused.stderr
    refused = cluster.cli("airbatch", "--nice=-100", str(script), user="nobody", check=False)
    assert refused.returncode == 1 and "only root and operators" in refused.stderr
    # a QOS that preempts others says who may use it; this one names no one: operators only
    refused = cluster.cli("airbatch", "--qos=high", "-A", "ml", str(script), user="nobody", check=False)
    assert refused.returncode == 1 and "user nobody may not use QOS high" in refused.stderr
    _cancel_all(cluster)


def test_priority_factors_estimated_start_and_shares(cluster):
    script = _sleeper(cluster)
    running = cluster.submit(script, "--nodes=2", "--gpus-per-node=3", "-A", "ml", "--time=0:30")
    cluster.wait_state(running, "RUNNING")
    big = cluster.submit(script, "--nodes=2", "--gpus-per-node=2", "-A", "ml", "--time=1:00", user="nobody")
    wait_for(lambda: cluster.job(big)["reason"] == "Resources", timeout=10, what="the big job to wait")
    rows = cluster.cli("airq", "--priority").stdout.splitlines()
    assert rows[0].split()[:5] == ["JOBID", "PARTITION", "USER", "ACCOUNT", "PRIORITY"]
    mine = next(r.split() for r in rows[1:] if r.split()[0] == str(big))
    assert mine[2:4] == ["nobody", "ml"] and int(mine[4]) > 0
    start = cluster.cli("airq", "--start", "-h").stdout.split("\n")[0].split()
    expected = cluster.job(running)["start_time"] + 30   # when the running job's time limit ends
    assert start[0] == str(big)
    est = time.mktime(time.strptime(start[5], "%Y-%m-%dT%H:%M:%S"))
    assert -1 < est - expected < 2   # (shown to the second)
    share = cluster.cli("airshare").stdout.splitlines()
    assert share[0].split() == ["Account", "User", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare"]
    ml = next(r.split() for r in share if r.split()[0] == "ml")
    assert ml[1:3] == ["3", "0.750000"]
    wait_for(lambda: any(r["account"] == "ml" and r["user"] == "root" and r["raw_usage"] > 0
                         for r in _shares(cluster)), timeout=15, what="usage to be charged while the job runs")
    cluster.cli("aircontrol", "account", "add", "physics", "--shares", "4")
    cluster.cli("aircontrol", "account", "add", "physics", "--user", "nobody")
    cluster.cli("aircontrol", "account", "modify", "physics", "--max-gpus", "2")
    rows = {(r["account"], r["user"]): r for r in _shares(cluster)}
    assert rows[("physics", None)]["max_gpus"] == 2 and rows[("physics", "nobody")]["raw_shares"] == 1
    job = cluster.submit(script, "-A", "physics", user="nobody")
    assert cluster.job(job)["account"] == "physics"
    denied = cluster.cli("aircontrol", "account", "remove", "physics", user="nobody", check=False)
    assert denied.returncode == 1 and "only root and operators" in denied.stderr
    busy = cluster.cli("aircontrol", "account", "remove", "physics", check=False)
    assert busy.returncode == 1 and "still has user nobody" in busy.stderr
    _cancel_all(cluster)


def _shares(cluster):
    import json
    return json.loads(cluster.cli("airshare", "--json").stdout)["shares"]


def test_begin_time_holds_a_job_until_then(cluster):
    began = time.time()
    job = cluster.submit(cluster.write_script("later.sh", "#!/bin/sh\ndate +%s.%N\n"), "--begin=now+3",
                         "-o", "later-%j.out")
    assert cluster.job(job)["reason"] in ("BeginTime", "None")
    wait_for(lambda: cluster.job(job)["reason"] == "BeginTime", timeout=5, what="the BeginTime reason")
    submitted = cluster.wait_state(job, "COMPLETED", timeout=20)["submit_time"]
    started = float((cluster.work / f"later-{job}.out").read_text())
    assert 3 <= started - began   # not before its time (airbatch read the clock after `began`)
    assert started - submitted < 5   # and soon after it (a pass, then the launch): 3 s after the submission
    bad = cluster.cli("airbatch", "--begin=tomorrowish", str(_sleeper(cluster)), check=False)
    assert bad.returncode == 1 and "--begin='tomorrowish': give now+N" in bad.stderr


def test_time_limit_warning_signal_then_timeout(cluster):
    script = cluster.write_script("warned.sh", "#!/bin/bash\ntrap 'echo warned at $(date +%s.%N)' USR1\n"
                                  "for i in $(seq 200); do sleep 0.2; done\n")
    job = cluster.submit(script, "--time=0:08", "--signal=B:USR1@4", "-o", "warned-%j.out")
    info = cluster.wait_state(job, "TIMEOUT", timeout=30)
    text = (cluster.work / f"warned-{job}.out").read_text()
    assert "warned at" in text
    warned_at = float(text.split("warned at")[1].split()[0])
    assert 3 <= warned_at - info["start_time"] <= 5.5   # 4 s before its limit of 8 s (a pass is 0.5 s at most)
