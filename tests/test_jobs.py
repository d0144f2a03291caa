"""Jobs on a real 2-node cluster: placement, identity, output, environment, gang starts, cancel."""
import os
import pwd
import subprocess
import sys

import psutil

from cluster import devices_cgroup, wait_for


ENV_SCRIPT = """#!/bin/bash
#AIR --job-name=envcheck
echo "node=$AIR_NODENAME user=$(id -un) uid=$(id -u) cwd=$(pwd)"
echo "job=$AIR_JOB_ID name=$AIR_JOB_NAME nodes=$AIR_JOB_NODELIST nnodes=$AIR_NNODES gpn=$AIR_GPUS_PER_NODE"
echo "cvd=$CUDA_VISIBLE_DEVICES submit=$AIR_SUBMIT_DIR"
echo "slurm=$SLURM_JOB_ID,$SLURM_JOB_NODELIST,$SLURM_NNODES,$SLURM_JOB_NAME,$SLURM_SUBMIT_DIR"
echo "mine=$MY_SETTING args=$*"
echo "to stderr" >&2
exit 3
"""


def test_job_runs_as_submitter_on_its_node_with_its_environment(cluster):
    script = cluster.write_script("env.sh", ENV_SCRIPT)
    nobody = pwd.getpwnam("nobody")
    job_id = int(cluster.cli("airbatch", "--parsable", "--gpus-per-node=2", "-e", "err-%j-%x.txt",
                             str(script), "a1", "a2", user="nobody",
                             env={"MY_SETTING": "kept"}).stdout)
    job = cluster.wait_state(job_id, "FAILED")
    assert job["exit_code"] == 3 and job["reason"] == "NonZeroExitCode", str(job)
    assert job["uid"] == nobody.pw_uid and job["user"] == "nobody"
    out_path = cluster.work / f"air-{job_id}.out"
    assert os.stat(out_path).st_uid == nobody.pw_uid
    lines = out_path.read_text().splitlines()
    node = job["nodes"][0]
    gpus = ",".join(map(str, job["gpus"][node]))
    assert lines == [
        f"node={node} user=nobody uid={nobody.pw_uid} cwd={cluster.work}",
        f"job={job_id} name=envcheck nodes={node} nnodes=1 gpn=2",
        f"cvd={gpus} submit={cluster.work}",
        f"slurm={job_id},{node},1,envcheck,{cluster.work}",
        "mine=kept args=a1 a2",
    ]
    assert (cluster.work / f"err-{job_id}-envcheck.txt").read_text() == "to stderr\n"
    # the same facts through airq and aircontrol, as a user reads them
    row = cluster.cli("airq", "-j", str(job_id), "-h", "-o", "%i %u %t %T %N %j").stdout.split()
    assert row == [str(job_id), "nobody", "F", "FAILED", node, "envcheck"]
    shown = cluster.cli("aircontrol", "show", "job", str(job_id)).stdout
    assert "JobState=FAILED" in shown and "ExitCode=3:0" in shown and f"NodeList={node}" in shown


def test_concurrent_jobs_on_one_node_get_disjoint_gpus(cluster):
    # SLURM_JOB_GPUS: the node's indices. CUDA_VISIBLE_DEVICES: the same where nothing else keeps a job
    # from the other GPUs; where the job's devices cgroup does (v1), CUDA numbers what it can open from 0
    script = cluster.write_script("gpus.sh", "#!/bin/sh\necho $SLURM_JOB_GPUS $CUDA_VISIBLE_DEVICES\nsleep 2\n")
    ids = [cluster.submit(script, "--gpus-per-node=2") for _ in range(4)]  # 8 GPUs in all: both nodes full
    jobs = [cluster.wait_state(i, "COMPLETED") for i in ids]
    by_node = {}
    for job_id, job in zip(ids, jobs):
        node = job["nodes"][0]
        seen, visible = (cluster.work / f"air-{job_id}.out").read_text().split()
        assert seen == ",".join(map(str, job["gpus"][node]))
        assert visible == ("0,1" if devices_cgroup() else seen)
        by_node.setdefault(node, []).append(set(seen.split(",")))
    for sets in by_node.values():
        assert len(sets) == 2 and not (sets[0] & sets[1])
    # they ran at the same time: all four started before any ended
    assert max(j["start_time"] for j in jobs) < min(j["end_time"] for j in jobs)


def test_two_node_job_starts_on_both_or_neither(cluster):
    script = cluster.write_script("two.sh", "#!/bin/sh\necho $AIR_JOB_NODELIST $AIR_NNODES\nsleep 1\n")
    blocker = cluster.submit(cluster.write_script("hold.sh", "#!/bin/sh\nsleep 60\n"), "--gpus-per-node=3")
    cluster.wait_state(blocker, "RUNNING")
    gang = cluster.submit(script, "-N", "2", "--gpus-per-node=2")
    # one node has 1 GPU free: the 2-node job must not start on the other alone
    job = wait_for(lambda: (j := cluster.job(gang))["reason"] == "Resources" and j, what="Resources reason")
    assert job["state"] == "PENDING" and job["nodes"] == []
    row = cluster.cli("airq", "-j", str(gang), "-h").stdout
    assert "PD" in row and "(Resources)" in row
    cluster.cli("aircancel", str(blocker))
    job = cluster.wait_state(gang, "COMPLETED")
    assert sorted(job["nodes"]) == ["node01", "node02"]
    assert (cluster.work / f"air-{gang}.out").read_text() == "node[01-02] 2\n"


def test_request_no_node_can_satisfy_is_refused_at_submit(cluster):
    before = cluster.db_rows()
    proc = cluster.cli("airbatch", "--nodes=1", "--gpus-per-node=8", "--wrap", "true", check=False)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert "8 GPUs per node requested" in proc.stderr and "no node in partition gpu has more than 4" in proc.stderr
    assert cluster.db_rows() == before


def _job_processes(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) or (p.info["environ"] or {}).get("MARK") == marker:
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_cancel_pending_and_running_leaves_no_process(cluster):
    marker = "cancel-marker-7781"
    script = cluster.write_script("long.sh", f"#!/bin/bash\ntrap '' TERM\nsleep 300 &\nsleep 301 # {marker}\n")
    running = cluster.submit(script, "--gpus-per-node=4", "-N", "2", env_marker := "--export=ALL,MARK=" + marker)
    cluster.wait_state(running, "RUNNING")
    wait_for(lambda: len(_job_processes(marker)) >= 3, what="the job's processes")  # bash and two sleeps
    pending = cluster.submit(script, "--gpus-per-node=1", env_marker)
    wait_for(lambda: cluster.job(pending)["reason"] == "Resources", what="a pending job")
    cluster.cli("aircancel", str(pending))
    assert cluster.job(pending)["state"] == "CANCELLED"
    cluster.cli("aircancel", str(running))
    # the script ignores SIGTERM: it is killed after the grace period (5 s on the local cluster)
    job = cluster.wait_state(running, "CANCELLED", timeout=20)
    assert job["reason"] == "Cancelled"
    wait_for(lambda: not _job_processes(marker), timeout=5, what="no process of the job left")
    codes = cluster.cli("airq", "-j", f"{running},{pending}", "-h", "-o", "%t").stdout.split()
    assert codes == ["CA", "CA"]


def test_cancel_of_unknown_or_done_job_is_an_error(cluster):
    proc = cluster.cli("aircancel", "99999", check=False)
    assert proc.returncode != 0 and proc.stderr.strip() == "aircancel: error: job 99999 does not exist"
    done = cluster.submit(cluster.write_script("quick.sh", "#!/bin/sh\ntrue\n"))
    cluster.wait_state(done, "COMPLETED")
    proc = cluster.cli("aircancel", str(done), check=False)
    assert proc.returncode != 0 and f"job {done} is completed; cannot cancel it" in proc.stderr


def test_user_cannot_cancel_another_users_job(cluster):
    job_id = cluster.submit(cluster.write_script("root.sh", "#!/bin/sh\nsleep 30\n"))
    proc = cluster.cli("aircancel", str(job_id), check=False, user="nobody")
    assert proc.returncode != 0 and "belongs to root" in proc.stderr
    assert cluster.job(job_id)["state"] in ("PENDING", "RUNNING")
    cluster.cli("aircancel", str(job_id))
    cluster.wait_state(job_id, "CANCELLED")


def test_airq_filters_and_airinfo_states(cluster):
    held = cluster.submit(cluster.write_script("held.sh", "#!/bin/sh\ntrue\n"), "-H", "-J", "heldjob")
    rows = cluster.queue("-t", "PD", "-n", "heldjob")
    assert [r["job_id"] for r in rows] == [held] and rows[0]["reason"] == "JobHeldUser"
    assert f"{held}" in cluster.cli("airq", "--me", "-h", "-o", "%i").stdout.split()
    assert cluster.cli("airq", "-u", "nobody", "-t", "PD", "-h").stdout == ""
    info = wait_for(lambda: (out := cluster.cli("airinfo", "-N", "-h", "-o", "%N %t %G").stdout.split("\n"))
                    and "node01 idle 4/4" in out and out, what="both nodes idle")
    assert "node02 idle 4/4" in info
    cluster.cli("aircancel", str(held))


def test_time_limit_ends_the_job_as_timeout(cluster):
    script = cluster.write_script("forever.sh", "#!/bin/sh\necho begun\nsleep 60\n")
    job_id = cluster.submit(script, "--time=0:02")
    job = cluster.wait_state(job_id, "TIMEOUT", timeout=15)
    assert job["reason"] == "TimeLimit" and 2 <= job["elapsed_s"] < 10
    assert cluster.cli("airq", "-j", str(job_id), "-h", "-o", "%t %l").stdout.split() == ["TO", "0:02"]


def test_scontrol_update_lowers_a_running_jobs_limit_for_its_owner_and_refuses_raising_it(cluster):
    script = cluster.write_script("long.sh", "#!/bin/sh\nsleep 60\n")
    job_id = int(cluster.cli("airbatch", "--parsable", "--time=10:00", str(script), user="nobody").stdout)
    cluster.wait_state(job_id, "RUNNING")
    refused = cluster.cli("aircontrol", "update", f"JobId={job_id}", "TimeLimit=+5:00", user="nobody", check=False)
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1
    assert "only root and operators may raise a time limit" in refused.stderr
    cluster.cli("aircontrol", "update", f"JobId={job_id}", "TimeLimit=0:03", user="nobody")
    job = cluster.wait_state(job_id, "TIMEOUT", timeout=20)
    assert job["reason"] == "TimeLimit" and 3 <= job["elapsed_s"] < 12
    assert cluster.cli("airq", "-j", str(job_id), "-h", "-o", "%l").stdout.split() == ["0:03"]


def test_test_only_submits_nothing(cluster):
    before = cluster.db_rows()
    out = cluster.cli("airbatch", "--test-only", "-N", "2", "--gpus-per-node=1", "--wrap", "true").stdout
    assert out.strip() == "airbatch: job would start now on node01,node02 in partition gpu"
    assert cluster.db_rows() == before


def test_airbatch_submits_without_importing_protobuf_or_grpc(cluster):
    """A submission's bytes are written by protos.protowire (a fifth of the call's time is protobuf's
    import); the job it makes is the one asked for."""
    code = ("import sys; from air.aircli.batch import command; from air.aircli.client import run; "
            "rc = run(command, 'airbatch', ['--parsable', '-H', '-J', 'light', '-N', '2', '--nice=7', '--wrap', 'true']); "
            "print(rc, *sorted(m for m in sys.modules if m.split('.')[0] in ('google', 'grpc', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, AIR_CONF=str(cluster.config)),
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    job_id, rc, *imported = out
    assert (rc, imported) == ("0", [])
    job = cluster.job(int(job_id))
    assert (job["name"], job["state"], job["reason"], job["num_nodes"]) == ("light", "PENDING", "JobHeldUser", 2), job
    assert "Nice=7 " in cluster.cli("aircontrol", "show", "job", job_id).stdout
    # and a plain airq lists it, with a filter, without protobuf either
    code = ("import sys; from air.aircli.queue import command; from air.aircli.client import run; "
            f"rc = run(command, 'airq', ['-h', '-t', 'PD', '-j', '{job_id}', '-u', 'root', '-p', 'gpu']); "
            "print(rc, *sorted(m for m in sys.modules if m.split('.')[0] in ('google', 'grpc', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, AIR_CONF=str(cluster.config)),
                         capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert out[0].split() == [job_id, "gpu", "light", "root", "PD", "0:00", "2", "(JobHeldUser)"]
    assert out[1:] == ["0"]


def test_signal_reaches_the_running_script(cluster):
    script = cluster.write_script("trap.sh", "#!/bin/bash\ntrap 'echo got USR2; exit 7' USR2\n"
                                             "echo ready\nwhile true; do sleep 0.1; done\n")
    job_id = cluster.submit(script)
    cluster.wait_state(job_id, "RUNNING")
    out = cluster.work / f"air-{job_id}.out"
    wait_for(lambda: out.exists() and "ready" in out.read_text(), what="the script to set its trap")
    cluster.cli("aircancel", "-s", "USR2", str(job_id))
    job = cluster.wait_state(job_id, "FAILED")
    # the whole process group gets it (the sleep too, which bash reports), as scancel -s does
    lines = out.read_text().splitlines()
    assert job["exit_code"] == 7 and lines[0] == "ready" and lines[-1] == "got USR2"


def test_output_where_the_owner_cannot_write_fails_the_job_and_writes_nothing(cluster):
    locked = cluster.root / "root-only"
    locked.mkdir(mode=0o755, exist_ok=True)
    script = cluster.write_script("out.sh", "#!/bin/sh\necho should-not-run > marker-$AIR_JOB_ID\n")
    job_id = int(cluster.cli("airbatch", "--parsable", "-o", f"{locked}/%j.out", str(script),
                             user="nobody").stdout)
    job = cluster.wait_state(job_id, "FAILED")
    assert job["reason"] == "LaunchFailed" and "Permission denied" in job["reason_detail"]
    assert f"{locked}/{job_id}.out" in job["reason_detail"]
    assert list(locked.iterdir()) == [] and not (cluster.work / f"marker-{job_id}").exists()
    shown = cluster.cli("aircontrol", "show", "job", str(job_id)).stdout
    assert "Reason=LaunchFailed" in shown and "Permission denied" in shown


def test_output_into_a_missing_directory_fails_a_root_job_with_the_reason(cluster):
    script = cluster.write_script("root-out.sh", "#!/bin/sh\necho hi\n")
    job_id = cluster.submit(script, "-o", "/nonexistent-air-dir/%j.out")
    job = cluster.wait_state(job_id, "FAILED")
    assert job["reason"] == "LaunchFailed"
    detail = job["reason_detail"]   # the shell's words: the file, and why it cannot be made
    assert f"/nonexistent-air-dir/{job_id}.out" in detail and ("nonexistent" in detail.split(": ")[-1]
                                                               or "No such file" in detail), detail


def test_nodelist_exclude_and_exclusive_put_jobs_where_asked(cluster):
    script = cluster.write_script("where.sh", "#!/bin/sh\necho $SLURM_JOB_NODELIST $CUDA_VISIBLE_DEVICES\nsleep 1\n")
    listed = cluster.submit(script, "-w", "node02", "--gpus-per-node=1")
    excluded = cluster.submit(script, "-x", "node02", "--gpus-per-node=1")
    whole = cluster.submit(script, "--exclusive", "--gpus-per-node=1", "-w", "node01")
    for job_id, node, gpus in ((listed, "node02", None), (excluded, "node01", None), (whole, "node01", "0,1,2,3")):
        job = cluster.wait_state(job_id, "COMPLETED")
        assert job["nodes"] == [node], job
        seen = (cluster.work / f"air-{job_id}.out").read_text().split()
        assert seen[0] == node and (gpus is None or seen[1] == gpus), seen
    shown = cluster.cli("aircontrol", "show", "job", str(whole)).stdout
    assert "ReqNodeList=node01 ExcNodeList=(null) Features=(null) OverSubscribe=NO" in shown, shown
    # nobody shares a node an exclusive job holds, though it asked for one GPU of four
    holder = cluster.submit(cluster.write_script("hold2.sh", "#!/bin/sh\nsleep 60\n"), "--exclusive", "-w", "node02")
    cluster.wait_state(holder, "RUNNING")
    small = cluster.submit(script, "-w", "node02")
    job = wait_for(lambda: (j := cluster.job(small))["reason"] == "Resources" and j, what="Resources reason")
    assert job["state"] == "PENDING"
    cluster.cli("aircancel", str(holder))
    assert cluster.wait_state(small, "COMPLETED")["nodes"] == ["node02"]
    # what can never be met: one line, nothing submitted
    before = cluster.db_rows()
    for options, message in ((["-w", "node09"], "invalid node name 'node09': no such node"),
                             (["-C", "a100"], "no node of partition gpu has feature 'a100'"),
                             (["-N", "1", "-w", "node[01-02]"], "names 2 nodes but --nodes=1"),
                             (["--exclusive=user"], "--exclusive")):
        proc = cluster.cli("airbatch", *options, "--wrap", "true", check=False)
        assert proc.returncode != 0 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc
        assert message in proc.stderr, proc.stderr
    assert cluster.db_rows() == before
