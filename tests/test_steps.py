"""airrun: steps across the nodes of a job, with real torch.distributed ranks (gloo)."""
import psutil

from air.airctld.model import Job, NodeAlloc
from air.airctld.steps import layout
from air.protos.stepenv import rank_base, rank_environment
from cluster import devices_cgroup, wait_for
from air.protos import air_pb2 as pb


ALLREDUCE = r'''
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "CUDA_VISIBLE_DEVICES", "AIR_NODENAME")
print("sum=%d" % t.item(), " ".join(k + "=" + os.environ[k] for k in keys), flush=True)
dist.destroy_process_group()
'''


def test_two_node_allreduce_with_labelled_output(cluster):
    (cluster.work / "allreduce.py").write_text(ALLREDUCE)
    script = cluster.write_script("step.sh", "#!/bin/sh\n#AIR -N 2 --gpus-per-node=2\n"
                                             "airrun --label python allreduce.py\necho airrun=$?\n")
    job_id = cluster.submit(script, user="nobody")
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=90)
    out = (cluster.work / f"air-{job_id}.out").read_text().splitlines()
    assert job["state"] == "COMPLETED", out
    assert out[-1] == "airrun=0"
    rows = sorted(line for line in out if line[:1].isdigit())
    gpus = {n: job["gpus"][n] for n in job["nodes"]}
    first, second = job["nodes"]
    expected = []
    for rank in range(4):
        node = first if rank < 2 else second
        local = rank % 2
        # the node's index, or where the run's devices cgroup keeps it to its GPUs, CUDA's numbering of them
        visible = sorted(gpus[node]).index(gpus[node][local]) if devices_cgroup() else gpus[node][local]
        expected.append(f"{rank}: sum=10 RANK={rank} WORLD_SIZE=4 LOCAL_RANK={local} LOCAL_WORLD_SIZE=2 "
                        f"NODE_RANK={rank // 2} CUDA_VISIBLE_DEVICES={visible} AIR_NODENAME={node}")
    assert rows == expected


def _step_processes():
    return [p for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []) == "sleep 77.5"]


def test_bad_rank_ends_the_step_everywhere(cluster):
    script = cluster.write_script("bad.sh", "#!/bin/sh\n#AIR -N 2\n"
                                            "airrun --ntasks-per-node=2 sh -c "
                                            "'if [ $RANK = 3 ]; then sleep 1; exit 3; fi; sleep 77.5'\n"
                                            "echo airrun=$?\n")
    job_id = cluster.submit(script)
    wait_for(lambda: len(_step_processes()) >= 3, timeout=20, what="three ranks sleeping")
    job = cluster.wait_state(job_id, "COMPLETED", timeout=30)
    assert (cluster.work / f"air-{job_id}.out").read_text().splitlines()[-1] == "airrun=3"
    wait_for(lambda: not _step_processes(), timeout=10, what="no rank of the step left")
    assert job["exit_code"] == 0


def test_cancel_kills_ranks_on_every_node(cluster):
    script = cluster.write_script("long.sh", "#!/bin/sh\n#AIR -N 2\nairrun sleep 77.5\n")
    job_id = cluster.submit(script)
    wait_for(lambda: len(_step_processes()) == 2, timeout=20, what="a rank on each node")
    cluster.cli("aircancel", str(job_id))
    cluster.wait_state(job_id, "CANCELLED", timeout=20)
    wait_for(lambda: not _step_processes(), timeout=10, what="no rank left after cancel")


def test_airrun_outside_a_job_allocates_runs_the_step_and_gives_the_nodes_back(cluster):
    # as srun outside an allocation: its own job, the step's output here, the step's exit code, the job ended
    proc = cluster.cli("airrun", "-N", "2", "--ntasks-per-node=2", "-J", "probe", "--label", "sh", "-c",
                       'echo "$AIR_NODENAME $SLURM_PROCID $SLURM_STEP_NUM_TASKS"', user="nobody",
                       env={"AIR_JOB_ID": ""})
    lines = sorted(proc.stdout.splitlines())
    assert [line.split()[2:] for line in lines] == [["0", "4"], ["1", "4"], ["2", "4"], ["3", "4"]], proc
    assert sorted({line.split()[1] for line in lines}) == ["node01", "node02"]
    job_id = cluster.queue("-n", "probe")[0]["job_id"]
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=20)
    assert job["state"] == "COMPLETED" and job["user"] == "nobody", job
    failing = cluster.cli("airrun", "-J", "probe2", "sh", "-c", "exit 3", check=False, env={"AIR_JOB_ID": ""})
    assert failing.returncode == 3, failing
    job_id = cluster.queue("-n", "probe2")[0]["job_id"]
    assert cluster.wait_state(job_id, "FAILED", "COMPLETED", timeout=20)["state"] == "FAILED"
    # the step's own outcome, as sacct shows it; the allocation's shell ended as the step did
    rows = cluster.cli("airacct", "-j", str(job_id), "-P", "-n", "-o", "JobID,JobName,State,ExitCode").stdout.split()
    assert rows == [f"{job_id}|probe2|FAILED|1:0", f"{job_id}.batch|batch|FAILED|1:0", f"{job_id}.0|sh|FAILED|3:0"]
    # its ranks know their job as srun's do, whatever --export kept (a step's SLURM_NNODES and
    # SLURM_NODELIST are the step's; the job's are SLURM_JOB_*)
    names = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES",
             "SLURM_JOB_PARTITION", "SLURM_SUBMIT_DIR", "SLURM_CLUSTER_NAME", "SLURM_JOB_USER", "SLURM_STEPID",
             "SLURM_NPROCS", "SLURM_NNODES", "SLURM_NODELIST")
    probe = cluster.cli("airrun", "-N", "2", "-J", "probe3", "--export=NONE", "--label", "/usr/bin/env",
                        env={"AIR_JOB_ID": ""})
    seen: dict[str, dict[str, str]] = {}
    for line in probe.stdout.splitlines():   # "RANK: NAME=VALUE"
        rank, _, variable = line.partition(": ")
        name, _, value = variable.partition("=")
        if name in names:
            seen.setdefault(rank.strip(), {})[name] = value
    job_id = cluster.queue("-n", "probe3")[0]["job_id"]
    assert sorted(seen) == ["0", "1"] and all(s == {
        "SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id), "SLURM_JOB_NAME": "probe3",
        "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_PARTITION": "gpu",
        "SLURM_SUBMIT_DIR": str(cluster.work), "SLURM_CLUSTER_NAME": "air", "SLURM_JOB_USER": "root",
        "SLURM_STEPID": "0", "SLURM_NPROCS": "2", "SLURM_NNODES": "2", "SLURM_NODELIST": "node[01-02]"}
        for s in seen.values()), probe.stdout
    wait_for(lambda: not any(j["state"] == "RUNNING" for j in cluster.queue()), timeout=20,
             what="the allocations given back")


def test_airrun_outside_a_job_stopped_by_sigterm_ends_its_ranks_and_its_allocation(cluster):
    import os
    import signal
    import subprocess
    from cluster import BIN
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", AIR_CONF=str(cluster.config), AIR_JOB_ID="")
    proc = subprocess.Popen([str(BIN / "airrun"), "-N", "2", "-J", "stopped", "sleep", "77.5"], env=env,
                            cwd=str(cluster.work), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(_step_processes()) == 2, timeout=20, what="a rank on each node")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) != 0
    finally:
        proc.kill()
    job_id = cluster.queue("-n", "stopped")[0]["job_id"]
    assert cluster.wait_state(job_id, "CANCELLED", "FAILED", "COMPLETED", timeout=20)["state"] == "CANCELLED"
    wait_for(lambda: not _step_processes(), timeout=10, what="no rank left")


def test_airrun_gives_up_a_frozen_node_instead_of_waiting_on_its_quiet_stream_for_ever(cluster):
    # a node daemon frozen (or its host cut off) while the step's ranks print nothing: TCP alone would
    # never fail the stream, and airrun would wait for that node's ranks for ever. The beats do.
    import os
    import signal
    import subprocess
    import time
    from cluster import BIN
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", AIR_CONF=str(cluster.config), AIR_JOB_ID="")
    # (on one node: a rank elsewhere, ended by the node's failure, would end the step through its exit)
    proc = subprocess.Popen([str(BIN / "airrun"), "-N", "1", "-w", "node02", "-J", "quiet", "sleep", "77.5"],
                            env=env, cwd=str(cluster.work), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    frozen = cluster.pids[2]   # node02's airnoded
    try:
        wait_for(lambda: len(_step_processes()) == 1, timeout=30, what="the rank on node02")
        time.sleep(1)   # (the stream's first beat, sent as the rank starts, has reached airrun)
        os.kill(frozen, signal.SIGSTOP)
        stopped = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 76 and "node02" in err, err   # (ExitCode.NODE_LOST)
        assert "no word from its node daemon" in err and time.monotonic() - stopped < 40, err
    finally:
        os.kill(frozen, signal.SIGCONT)
        proc.kill()
    wait_for(lambda: not _step_processes(), timeout=30, what="no rank left")


def test_airrun_stopped_a_while_does_not_take_its_own_silence_for_its_nodes(cluster):
    # Ctrl-Z then fg, a paused VM: airrun heard nothing for longer than a node may be silent, because
    # it was stopped itself. The step goes on.
    import os
    import signal
    import time
    script = cluster.write_script("paused.sh", "#!/bin/sh\nairrun sh -c 'sleep 16; echo survived'\necho airrun=$?\n")
    job_id = cluster.submit(script)
    cluster.wait_state(job_id, "RUNNING", timeout=20)
    wait_for(lambda: [p for p in psutil.process_iter(["cmdline"])
                      if (p.info["cmdline"] or [])[-1:] == ["sleep 16; echo survived"]], timeout=20,
             what="the step's rank")
    airrun = [p for p in psutil.process_iter(["cmdline"])
              if any(a.endswith("/airrun") for a in p.info["cmdline"] or [])
              and (p.info["cmdline"] or [])[-1:] == ["sleep 16; echo survived"]]
    assert len(airrun) == 1, airrun
    time.sleep(1)   # (the stream's first beat has reached airrun)
    os.kill(airrun[0].pid, signal.SIGSTOP)
    try:
        time.sleep(12)   # longer than the silence airrun takes a node for lost, plus its patience
    finally:
        os.kill(airrun[0].pid, signal.SIGCONT)
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=40)
    out = (cluster.work / f"air-{job_id}.out").read_text()
    assert job["state"] == "COMPLETED" and "survived" in out and "airrun=0" in out, out


def test_airrun_killed_outside_a_job_loses_its_allocation_at_the_inactive_limit_and_signals_reach_its_step(cluster):
    # Slurm's InactiveLimit: an airrun that is gone (kill -9) no longer renews its allocation, which then
    # ends (TIMEOUT, InactiveLimit) instead of holding its nodes to the time limit. Alive, it renews it;
    # a user's signal to the allocation reaches the step's ranks and never ends the allocation itself.
    import os
    import signal
    import subprocess
    import time
    from cluster import BIN, INACTIVE_LIMIT
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", AIR_CONF=str(cluster.config), AIR_JOB_ID="")
    out = cluster.work / "leased.out"
    loop = 'trap "echo got-usr1" USR1; trap "echo got-usr2" USR2; while :; do sleep 77.5 & wait $!; done'
    with open(out, "wb") as sink:
        proc = subprocess.Popen([str(BIN / "airrun"), "-N", "2", "-J", "leased", "sh", "-c", loop], env=env,
                                cwd=str(cluster.work), stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(_step_processes()) == 2, timeout=30, what="a rank on each node")
        job_id = cluster.queue("-n", "leased")[0]["job_id"]
        for sig in ("USR1", "USR2"):   # (the allocation's own shell ends on these from airrun only)
            cluster.cli("aircancel", "-s", sig, str(job_id))
        wait_for(lambda: out.read_text().count("got-usr1") == 2 and out.read_text().count("got-usr2") == 2,
                 timeout=20, what="both ranks to get both signals")
        time.sleep(2 * INACTIVE_LIMIT)   # renewed meanwhile
        assert cluster.job(job_id)["state"] == "RUNNING" and proc.poll() is None, out.read_text()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        job = cluster.wait_state(job_id, "TIMEOUT", "CANCELLED", "FAILED", "COMPLETED", timeout=INACTIVE_LIMIT + 20)
        assert job["state"] == "TIMEOUT" and job["reason"] == "InactiveLimit", job
        assert time.monotonic() - killed > INACTIVE_LIMIT - 2, "ended before its lease ran out"
        wait_for(lambda: not _step_processes(), timeout=20, what="no rank left")
    finally:
        proc.kill()


def test_airrun_outside_a_job_stopped_while_it_waits_gives_its_queued_allocation_back(cluster):
    import os
    import signal
    import subprocess
    from cluster import BIN
    blocker = cluster.submit(cluster.write_script("block.sh", "#!/bin/sh\nsleep 60\n"), "-N", "2",
                             "--gpus-per-node=4")
    cluster.wait_state(blocker, "RUNNING")
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", AIR_CONF=str(cluster.config), AIR_JOB_ID="")
    proc = subprocess.Popen([str(BIN / "airrun"), "--gpus-per-node=1", "-J", "queued", "true"], env=env,
                            cwd=str(cluster.work), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: cluster.queue("-n", "queued"), timeout=20, what="the allocation to be queued")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode != 0 and "queued and waiting for resources" in err, err
    finally:
        proc.kill()
        cluster.cli("aircancel", str(blocker))
    job_id = cluster.queue("-n", "queued")[0]["job_id"]
    assert cluster.wait_state(job_id, "CANCELLED", timeout=20)["state"] == "CANCELLED"


def test_airrun_bad_layouts(cluster):
    script = cluster.write_script("lay.sh", "#!/bin/sh\n#AIR -N 1 --gpus-per-node=2\n"
                                            "airrun --ntasks-per-node=2 --gpus-per-task=2 true\necho rc=$?\n")
    job_id = cluster.submit(script)
    cluster.wait_state(job_id, "COMPLETED")
    out = (cluster.work / f"air-{job_id}.out").read_text()
    assert "2 tasks with 2 GPUs each need 4 GPUs" in out and out.endswith("rc=1\n")


def _job(allocation):
    return Job(job_id=5, uid=0, gid=0, user="u", name="n", partition="p", num_nodes=len(allocation),
               gpus_per_node=4, cpus_per_node=1, time_limit_s=0, submit_time=0, request=pb.JobRequest(),
               allocation=tuple(allocation))


def test_layout_and_rank_environment():
    job = _job([NodeAlloc("a", (0, 1, 2, 3), 1), NodeAlloc("b", (4, 5, 6, 7), 1)])
    nodes, world = layout(job, pb.StepSpec(gpus_per_task=2), {"a": "10.0.0.1:6818", "b": "10.0.0.2:6818"})
    assert world == 4
    assert [(n.node, list(n.ranks), list(n.gpu_sets)) for n in nodes] == [
        ("a", [0, 1], ["0,1", "2,3"]), ("b", [2, 3], ["4,5", "6,7"])]
    # the job's GPUs on each node, for the run's devices cgroup there (a step may use fewer of them)
    assert [list(n.allocation.gpus) for n in nodes] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    fewer, _ = layout(job, pb.StepSpec(ntasks_per_node=1, gpus_per_task=1), {"a": "x:1", "b": "x:2"})
    assert [list(n.gpu_sets) for n in fewer] == [["0"], ["4"]]
    assert [list(n.allocation.gpus) for n in fewer] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    step = pb.Step(job_id=5, step_id=2, world_size=world, master_addr="10.0.0.1", master_port=29500, nodes=nodes)
    env = rank_environment(step, 1, 1, {"PATH": "/bin", "RANK": "stale"})
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "AIR_STEP_ID",
                                "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS",
                                "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES",
                                "SLURM_STEP_TASKS_PER_NODE", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE", "SLURM_NODELIST",
                                "SLURM_TASKS_PER_NODE", "PATH")} == {
        "RANK": "3", "LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "6,7", "AIR_STEP_ID": "2",
        "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "4",
        "SLURM_STEP_ID": "2", "SLURM_STEP_NODELIST": "a,b", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NODELIST": "a,b",
        "SLURM_TASKS_PER_NODE": "2(x2)", "PATH": "/bin"}
    nodes, world = layout(_job([NodeAlloc("a", (), 1)]), pb.StepSpec(), {"a": "x:1"})
    assert world == 1 and list(nodes[0].gpu_sets) == [""]


def test_a_ranks_job_variables_win_over_what_srun_sent_and_the_nodes_own_over_both():
    """srun's environment (a user's: anything), then the job's variables from the controller, then
    what the node daemon sets for the run (its progress files, the owner): a user cannot point a rank
    at another job or at another run's files."""
    step = pb.Step(job_id=5, step_id=0, world_size=1, master_addr="a", master_port=1,
                   nodes=[pb.StepNode(node="a", ranks=[0], gpu_sets=[""])],
                   spec=pb.StepSpec(environment={"SLURM_JOB_ID": "1", "AIR_JOB_ID": "1", "HOME": "/evil",
                                                 "AIR_STOP_REASON_FILE": "/tmp/evil", "MINE": "kept"}),
                   job_environment={"SLURM_JOB_ID": "5", "AIR_JOB_ID": "5", "SLURM_JOB_NAME": "train",
                                    "AIR_STOP_REASON_FILE": "/tmp/also-not"})
    env = rank_environment(step, 0, 0, rank_base(step, {"AIR_STOP_REASON_FILE": "/spool/job5.0/stop", "HOME": "/home/u"}))
    assert {k: env[k] for k in ("SLURM_JOB_ID", "AIR_JOB_ID", "SLURM_JOB_NAME", "AIR_STOP_REASON_FILE", "HOME",
                                "MINE")} == {
        "SLURM_JOB_ID": "5", "AIR_JOB_ID": "5", "SLURM_JOB_NAME": "train", "AIR_STOP_REASON_FILE": "/spool/job5.0/stop",
        "HOME": "/home/u", "MINE": "kept"}
