"""Requeue and resume on a real cluster: the job ends where an uninterrupted run would have."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from cluster import free_port, wait_for

pytestmark = pytest.mark.serial   # (its torch ranks take both cores: run alone, see scripts/test.sh)

HERE = Path(__file__).resolve().parent


def _baseline(tmp: Path, steps: int) -> dict:
    out = tmp / "baseline"
    subprocess.run([sys.executable, str(HERE / "runtime_train.py"), "--dir", str(tmp / "ckpt-baseline"),
                    "--out", str(out), "--steps", str(steps)], check=True, capture_output=True, timeout=120,
                   env=dict(os.environ, PYTHONPATH=str(HERE.parent)))
    return torch.load(f"{out}.pt")


def _training_job(cluster, name: str, steps: int, *options: str) -> tuple[int, Path]:
    out = cluster.work / name
    script = cluster.write_script(f"{name}.sh", f"#!/bin/sh\nexec {sys.executable} {HERE / 'runtime_train.py'} "
                                  f"--dir {cluster.work / (name + '-ckpt')} --out {out} --steps {steps} "
                                  f"--every 5 --sleep 0.3\n")
    return cluster.submit(script, *options), out


def _steps_done(out: Path) -> int:
    log = Path(f"{out}.rank0.log")
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_requeue_checkpoints_stops_and_resumes_to_the_same_result(cluster, tmp_path):
    job_id, out = _training_job(cluster, "req", 30)
    wait_for(lambda: _steps_done(out) >= 8, timeout=60, what="training to pass step 8")
    cluster.cli("aircontrol", "requeue", str(job_id))
    job = wait_for(lambda: (j := cluster.job(job_id))["restart_count"] == 1 and j, timeout=30,
                   what="the job to be requeued")
    assert job["last_stop_reason"] == "Requeued"
    job = cluster.wait_state(job_id, "COMPLETED", timeout=90)
    shown = cluster.cli("aircontrol", "show", "job", str(job_id)).stdout
    assert "Restarts=1" in shown and "LastStopReason=Requeued" in shown
    # it stopped at the step it was told at and checkpointed there, then went on from it
    steps = [int(line.split()[0]) for line in Path(f"{out}.rank0.log").read_text().splitlines()]
    assert steps == list(range(1, 31))
    final, base = torch.load(f"{out}.pt"), _baseline(tmp_path, 30)
    assert all(torch.equal(final[k], base[k]) for k in base)


def test_node_death_requeues_and_resumes_from_the_last_checkpoint(cluster, tmp_path):
    job_id, out = _training_job(cluster, "nf", 25)
    job = cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: _steps_done(out) >= 12, timeout=60, what="training to pass step 12")
    node = job["nodes"][0]
    # the host dies: its daemon and the job's processes with it
    cluster.kill_node(int(node[-2:]) - 1)
    for p in psutil.process_iter(["cmdline"]):
        if str(out) in " ".join(p.info["cmdline"] or []):
            p.send_signal(signal.SIGKILL)
    job = wait_for(lambda: (j := cluster.job(job_id))["restart_count"] == 1 and j, timeout=20,
                   what="the job to be requeued after the node failure")
    assert job["last_stop_reason"] == "NodeFail"
    import sqlite3
    conn = sqlite3.connect(cluster.dir / "state" / "air.db")
    details = [d for (d,) in conn.execute("SELECT detail FROM events WHERE job_id = ? AND new_state = 'PENDING' "
                                          "AND old_state = 'RUNNING'", [job_id])]
    conn.close()
    assert details == [f"node {node} stopped responding"]
    job = cluster.wait_state(job_id, "COMPLETED", timeout=90)
    assert job["nodes"] != [node]
    cluster.start_node(int(node[-2:]) - 1)   # the host is back, for the tests after this one
    wait_for(lambda: "down" not in cluster.cli("airinfo", "-N", "-h", "-o", "%N %t").stdout, timeout=20,
             what=f"{node} to be up again")
    final, base = torch.load(f"{out}.pt"), _baseline(tmp_path, 25)
    assert all(torch.equal(final[k], base[k]) for k in base)


def test_retries_requeue_a_failing_job(cluster):
    script = cluster.write_script("flaky.sh", "#!/bin/sh\necho try $AIR_RESTART_COUNT $AIR_LAST_STOP_REASON\n"
                                              "[ \"$AIR_RESTART_COUNT\" -ge 1 ]\n")
    job_id = cluster.submit(script, "--retries=2")
    job = cluster.wait_state(job_id, "COMPLETED", timeout=30)
    assert job["restart_count"] == 1 and job["last_stop_reason"] == "NonZeroExitCode"
    assert (cluster.work / f"air-{job_id}.out").read_text() == "try 0\ntry 1 NonZeroExitCode\n"
    once = cluster.submit(script)   # no --retries: a failure of its own is final
    assert cluster.wait_state(once, "FAILED")["restart_count"] == 0


def _acct(cluster, *args: str, user: str | None = None) -> list[list[str]]:
    out = cluster.cli("airacct", "-P", "-n", *args, user=user).stdout
    return [line.split("|") for line in out.splitlines()]


def test_history_shows_each_run_its_steps_and_who_cancelled(cluster):
    """airacct, as sacct: a job that failed once and was retried is one record (two with -D), each
    run followed by its batch step and its steps; a cancelled job says by whom; the queue forgets
    neither once they have left it."""
    script = cluster.write_script("twice.sh", "#!/bin/sh\nairrun -N 2 true\n"
                                              "[ \"$AIR_RESTART_COUNT\" -ge 1 ] || exit 3\nairrun hostname\n")
    job_id = cluster.submit(script, "-N", "2", "--retries=1", "--job-name=twice")
    cluster.wait_state(job_id, "COMPLETED", timeout=40)
    cancelled = cluster.submit(cluster.write_script("idle.sh", "#!/bin/sh\nsleep 60\n"), "--hold")
    cluster.cli("aircancel", str(cancelled), user="nobody", check=False)   # not theirs: refused
    cluster.cli("aircancel", str(cancelled))
    cluster.wait_state(cancelled, "CANCELLED")

    fields = "-o", "JobID,JobName,State,ExitCode,RestartCnt,NNodes,NTasks"
    assert _acct(cluster, "-j", str(job_id), *fields) == [
        [str(job_id), "twice", "COMPLETED", "0:0", "1", "2", ""],
        [f"{job_id}.batch", "batch", "COMPLETED", "0:0", "", "1", "1"],
        [f"{job_id}.1", "true", "COMPLETED", "0:0", "", "2", "2"],
        [f"{job_id}.2", "hostname", "COMPLETED", "0:0", "", "2", "2"]]
    assert _acct(cluster, "-j", str(job_id), "-D", "-X", "-o", "JobID,State,ExitCode") == [
        [str(job_id), "REQUEUED", "3:0"], [str(job_id), "COMPLETED", "0:0"]]
    assert _acct(cluster, "-j", str(cancelled), "-o", "JobID,State,Start,NodeList") == [
        [str(cancelled), "CANCELLED by 0", "Unknown", "None assigned"]]
    # -s narrows (without -S, to the jobs in those states now, as sacct does); root sees every user's jobs
    mine = _acct(cluster, "-X", "-s", "CA", "-S", "today", "-o", "JobID")
    assert [str(cancelled)] in mine and [str(job_id)] not in mine
    assert [str(cancelled)] not in _acct(cluster, "-X", "-s", "CA", "-o", "JobID")
    submitted = _acct(cluster, "-j", str(job_id), "-X", "-o", "SubmitLine,WorkDir,Account,QOS,Timelimit")
    assert submitted[0][0].startswith("airbatch --parsable -N 2 --retries=1") and submitted[0][1] == str(cluster.work)
    assert submitted[0][3] == "normal"
    as_json = json.loads(cluster.cli("airacct", "-j", str(job_id), "--json").stdout)
    assert set(as_json) == {"jobs", "meta", "errors", "warnings"}
    assert [s["step"]["id"] for s in as_json["jobs"][0]["steps"]] == [f"{job_id}.batch", f"{job_id}.1",
                                                                      f"{job_id}.2"]
    # a user sees their own jobs unless they ask for others' (this cluster does not keep jobs private)
    assert _acct(cluster, "-o", "JobID", user="nobody") == []
    assert [str(job_id)] in _acct(cluster, "-a", "-X", "-o", "JobID", user="nobody")
    assert _acct(cluster, "-j", str(job_id), "-o", "JobID,SubmitLine,JobName", user="nobody") == [   # not theirs
        [str(job_id), "", "twice"], [f"{job_id}.batch", "", "batch"], [f"{job_id}.1", "", ""],
        [f"{job_id}.2", "", ""]]
    bad = cluster.cli("airacct", "-S", "yesterday-ish", check=False)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "is not a time" in bad.stderr
    bad = cluster.cli("airacct", "-o", "JobID,Bogus", check=False)
    assert bad.returncode == 1 and "unknown field 'Bogus'" in bad.stderr


def test_slurm_command_names_drive_the_cluster(cluster, tmp_path):
    """With the front ends installed (aircontrol slurm-commands install), a tool that calls sbatch,
    squeue, scontrol, scancel and sacct drives AIR."""
    cluster.cli("aircontrol", "slurm-commands", "install", "--dir", str(tmp_path))
    env = dict(os.environ, AIR_CONF=str(cluster.config), PATH=f"{tmp_path}:{os.environ['PATH']}")

    def run(*args: str) -> str:
        proc = subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=cluster.work, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    job_id = int(run("sbatch", "--parsable", "-N", "2", "--wrap", "scontrol show hostnames"))
    cluster.wait_state(job_id, "COMPLETED")
    assert (cluster.work / f"air-{job_id}.out").read_text().splitlines() == cluster.job(job_id)["nodes"]
    held = int(run("sbatch", "--parsable", "--hold", "--wrap", "true").strip())
    assert run("squeue", "-h", "-j", str(held), "-o", "%i %t").split() == [str(held), "PD"]
    assert run("squeue", "-h", "-j", str(held), "-O", "JobID:8,StateCompact:.4").split() == [str(held), "PD"]
    assert run("squeue", "-h", "-j", str(held), "-p", "no-such-partition") == ""
    partition = cluster.job(held)["partition"]
    assert run("sinfo", "-h", "-p", partition, "-o", "%P").split()[0].rstrip("*") == partition
    shown = run("scontrol", "show", "partition", partition).splitlines()
    assert shown[0] == f"PartitionName={partition}" and "TotalNodes=2 TotalCPUs=" in shown[-1]
    run("scancel", str(held))
    assert run("sacct", "-j", f"{job_id},{held}", "-X", "-P", "-n", "-o", "JobID,State").splitlines() == [
        f"{job_id}|COMPLETED", f"{held}|CANCELLED by 0"]
    # scancel by name, then by state; sbatch --test-only speaks as sbatch
    named, other = (int(run("sbatch", "--parsable", "--hold", "-J", name, "--wrap", "true")) for name in ("aa", "bb"))
    run("scancel", "-n", "aa")
    assert [cluster.job(named)["state"], cluster.job(other)["state"]] == ["CANCELLED", "PENDING"]
    run("scancel", "-t", "PD")
    assert cluster.job(other)["state"] == "CANCELLED"
    assert run("sbatch", "--test-only", "--wrap", "true").startswith("sbatch: job would start now on node0")

    # sbatch -W returns the job's exit; --open-mode=truncate starts each run's output afresh; -n and
    # --gpus-per-task become tasks and GPUs on each node; --comment is kept; an unknown option is refused
    waited = subprocess.run(["sbatch", "-W", "-n", "2", "--gpus-per-task=1", "--open-mode=truncate", "--retries=1",
                             "--comment=two tries", "-o", "tries-%j.out", "--wrap",
                             'echo "run $SLURM_RESTART_COUNT of $SLURM_NTASKS tasks on GPUs $CUDA_VISIBLE_DEVICES"; '
                             'exit $((3 - SLURM_RESTART_COUNT))'],
                            capture_output=True, text=True, env=env, cwd=cluster.work, timeout=90)
    assert waited.returncode == 2, waited.stderr
    tries = int(waited.stdout.split()[-1])
    assert (cluster.work / f"tries-{tries}.out").read_text().startswith("run 1 of 2 tasks on GPUs ")
    assert run("sacct", "-j", str(tries), "-X", "-P", "-n", "-o", "State,ExitCode,Comment,RestartCnt").split() == [
        "FAILED|2:0|two", "tries|1"]
    # scancel -b: the batch shell gets the signal, the step's task does not
    signalled = int(run("sbatch", "--parsable", "-o", "sig-%j.out", "--wrap",
                        "trap 'echo batch got USR1; exit 0' USR1; "
                        "srun sh -c 'trap \"echo step got USR1\" USR1; echo step ready; sleep 30 & wait' & wait"))
    sig_out = cluster.work / f"sig-{signalled}.out"
    wait_for(lambda: sig_out.exists() and "step ready" in sig_out.read_text(), timeout=30, what="the step to run")
    run("scancel", "-b", "-s", "USR1", str(signalled))
    cluster.wait_state(signalled, "COMPLETED", timeout=30)
    text = sig_out.read_text()
    assert "batch got USR1" in text and "step got USR1" not in text, text
    refused = subprocess.run(["sbatch", "--mail-typo=END", "--wrap", "true"], capture_output=True, text=True, env=env,
                             cwd=cluster.work, timeout=60)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "sbatch: error: " in refused.stderr
    # --exclusive and -w: whole nodes where asked (scontrol shows OverSubscribe=NO)
    whole = int(run("sbatch", "--parsable", "--exclusive", "-w", "node02", "--wrap", "true"))
    assert cluster.wait_state(whole, "COMPLETED")["nodes"] == ["node02"]
    assert "OverSubscribe=NO" in run("scontrol", "show", "job", str(whole))


def test_sbatch_signal_reaches_the_steps_tasks_and_with_b_the_batch_shell_only(cluster, tmp_path):
    """sbatch(1): --signal=SIG@T goes to every step's tasks, not the batch shell; --signal=B:SIG@T to the
    batch shell only. Both jobs trap USR1 in the shell and in the task, and run into their time limit."""
    env = cluster.slurm_commands(tmp_path / "bin")
    script = ("#!/bin/bash\ntrap 'echo batch got USR1' USR1\n"
              "srun sh -c 'trap \"echo step got USR1\" USR1; echo step ready; "
              "for i in $(seq 100); do sleep 0.2; done' &\n"
              "while :; do wait; done\n")
    path = cluster.write_script("warn.sh", script)
    jobs = {}
    for form in ("USR1@5", "B:USR1@5"):
        out = subprocess.run(["sbatch", "--parsable", "--time=0:10", f"--signal={form}", "-o", "warn-%j.out",
                              str(path)], capture_output=True, text=True, env=env, cwd=cluster.work, timeout=60)
        assert out.returncode == 0, out.stderr
        jobs[form] = int(out.stdout)
    for form, job_id in jobs.items():
        cluster.wait_state(job_id, "TIMEOUT", timeout=40)
    steps = (cluster.work / f"warn-{jobs['USR1@5']}.out").read_text()
    batch = (cluster.work / f"warn-{jobs['B:USR1@5']}.out").read_text()
    assert "step ready" in steps and "step got USR1" in steps and "batch got USR1" not in steps, steps
    assert "step ready" in batch and "batch got USR1" in batch and "step got USR1" not in batch, batch


def test_submitit_runs_a_function_and_maps_an_array_through_the_slurm_commands(cluster, tmp_path, monkeypatch):
    """submitit (1.5, its Slurm executor, unchanged) drives AIR through sbatch, srun, sacct and scancel."""
    import submitit
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cluster.cli("aircontrol", "slurm-commands", "install", "--dir", str(bindir))
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("AIR_CONF", str(cluster.config))
    executor = submitit.AutoExecutor(folder=cluster.work / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_array_parallelism=3)
    job = executor.submit(pow, 2, 10)
    assert job.result() == 1024   # read from its result file, written just before the job ends
    wait_for(lambda: job.get_info().get("State") == "COMPLETED", timeout=20, interval=0.5, what="COMPLETED")
    jobs = executor.map_array(abs, [-i for i in range(10)])
    assert [j.result() for j in jobs] == list(range(10))
    wait_for(lambda: {j.get_info().get("State") for j in jobs} == {"COMPLETED"}, timeout=20, interval=0.5,
             what="every task COMPLETED in sacct")
    array = jobs[0].job_id.split("_")[0]
    assert jobs[3].job_id == f"{array}_3"
    spans = [line.split("|") for line in cluster.cli("airacct", "-j", array, "-X", "-P", "-n", "-o",
                                                     "ElapsedRaw,End").stdout.splitlines()]
    runs = [(_epoch(end) - int(elapsed), _epoch(end)) for elapsed, end in spans]   # whole seconds
    at_once = max(sum(s < t + 0.5 and t + 0.5 < e for s, e in runs) for t, _ in runs)
    assert len(runs) == 10 and at_once <= 3, f"{at_once} tasks of a %3 array ran at once: {runs}"
    # PENDING while it waits (for its --begin time, here), CANCELLED once cancelled before it ran
    executor.update_parameters(slurm_additional_parameters={"begin": "now+600"})
    later = executor.submit(pow, 2, 2)
    wait_for(lambda: later.get_info().get("State") == "PENDING", timeout=20, interval=0.5, what="PENDING")
    later.cancel()
    wait_for(lambda: later.get_info().get("State", "").startswith("CANCELLED"), timeout=20, interval=0.5,
             what="the pending job CANCELLED")
    executor.update_parameters(slurm_additional_parameters={})
    slow = executor.submit(time.sleep, 60)
    wait_for(lambda: slow.get_info().get("State") == "RUNNING", timeout=30, interval=0.5, what="the job to run")
    slow.cancel()
    wait_for(lambda: slow.get_info().get("State", "").startswith("CANCELLED"), timeout=30, interval=0.5,
             what="submitit to see the job cancelled")


COUNTER = """import os
import time

import submitit


class Counter(submitit.helpers.Checkpointable):
    # counts half-seconds up to a target; the count is kept in its checkpoint (the pickled object)

    def __init__(self):
        self.count, self.runs = 0, []

    def __call__(self, target):
        self.runs.append(int(os.environ["SLURM_RESTART_COUNT"]))
        while self.count < target:
            time.sleep(0.5)
            self.count += 1
        return self.count, self.runs
"""


def test_a_submitit_checkpointable_job_signalled_before_its_limit_requeues_itself_and_finishes(
        cluster, tmp_path, monkeypatch):
    """submitit's timeout path, as on Slurm: sbatch's --signal=USR2@50 reaches the task under srun (not the
    batch shell), which checkpoints, calls scontrol requeue, and the next run goes on from the checkpoint."""
    import submitit
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cluster.cli("aircontrol", "slurm-commands", "install", "--dir", str(bindir))
    (cluster.work / "counting.py").write_text(COUNTER)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("AIR_CONF", str(cluster.config))
    monkeypatch.setenv("PYTHONPATH", str(cluster.work))
    monkeypatch.syspath_prepend(str(cluster.work))
    from counting import Counter
    executor = submitit.AutoExecutor(folder=cluster.work / "submitit-ckpt", cluster="slurm")
    executor.update_parameters(timeout_min=1, slurm_signal_delay_s=50)   # the warning 10 s after each start
    job = executor.submit(Counter(), 24)                                # 12 s of counting, besides its start
    count, runs = job.result()
    assert count == 24 and runs[0] == 0 and len(runs) >= 2 and runs == sorted(runs), runs
    wait_for(lambda: cluster.cli("airacct", "-j", job.job_id, "-X", "-P", "-n", "-o", "State").stdout.strip()
             == "COMPLETED", timeout=20, what="the job to complete")
    restarts = cluster.cli("airacct", "-j", job.job_id, "-X", "-P", "-n", "-o", "RestartCnt").stdout.strip()
    assert int(restarts) == len(runs) - 1


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


LIGHTNING = """import json
from lightning_fabric.plugins.environments import SLURMEnvironment as S
e = S()
print(json.dumps([S.detect(), e.global_rank(), e.local_rank(), e.node_rank(), e.world_size(), e.main_address,
                  e.main_port]))
"""


def test_lightning_sees_each_rank_of_a_two_node_srun_step(cluster, tmp_path):
    """Lightning's SLURMEnvironment inside a 2-node x 2-task srun step: detected, and each task's ranks,
    world size, main address and port as torch.distributed will use them."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cluster.cli("aircontrol", "slurm-commands", "install", "--dir", str(bindir))
    (cluster.work / "lightning_env.py").write_text(LIGHTNING)
    script = cluster.write_script("lightning.sh", f"#!/bin/sh\n#SBATCH -N 2 --ntasks-per-node=2\n"
                                                  f"srun {sys.executable} lightning_env.py\n")
    job_id = cluster.submit(script, env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=90)
    out = (cluster.work / f"air-{job_id}.out").read_text()
    assert job["state"] == "COMPLETED", out
    rows = sorted(json.loads(line) for line in out.splitlines() if line.startswith("["))
    address, port = rows[0][5], rows[0][6]
    assert address == cluster.host(0) and port > 0
    assert rows == [[True, 0, 0, 0, 4, address, port], [True, 1, 1, 0, 4, address, port],
                    [True, 2, 0, 1, 4, address, port], [True, 3, 1, 1, 4, address, port]]


def test_no_requeue_jobs_refuse_requeue(cluster):
    job_id = cluster.submit(cluster.write_script("nr.sh", "#!/bin/sh\nsleep 30\n"), "--no-requeue")
    cluster.wait_state(job_id, "RUNNING")
    proc = cluster.cli("aircontrol", "requeue", str(job_id), check=False)
    assert proc.returncode != 0 and "was submitted with --no-requeue" in proc.stderr
    cluster.cli("aircancel", str(job_id))


TITAN_TRAIN = r'''
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("rank=%d world=%d local=%s sum=%d node=%s" % (dist.get_rank(), dist.get_world_size(), os.environ["LOCAL_RANK"],
                                                   t.item(), os.environ["SLURM_NODEID"]), flush=True)
dist.destroy_process_group()
'''

# As torchtitan's multinode_trainer.slurm (its #SBATCH lines, the head node's address from a one-task
# srun, torchrun under srun with a c10d rendezvous), with 2 GPUs a task where it asks for 8.
TITAN_SCRIPT = """#!/bin/bash
#SBATCH --job-name=torchtitan_multi_node
#SBATCH --ntasks=2
#SBATCH --nodes=2
#SBATCH --gpus-per-task=2
#SBATCH --cpus-per-task=2

nodes=( $( scontrol show hostnames $SLURM_JOB_NODELIST ) )
nodes_array=($nodes)
head_node=${nodes_array[0]}
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address)
echo Node IP: $head_node_ip
export LOGLEVEL=INFO
srun torchrun --nnodes 2 --nproc_per_node 2 --rdzv_id 101 --rdzv_backend c10d --rdzv_endpoint "$head_node_ip:PORT" \\
    ./titan_train.py
"""


def test_a_torchtitan_style_script_runs_unchanged_and_trains_with_gloo_ranks(cluster, tmp_path):
    bindir = tmp_path / "bin"
    cluster.slurm_commands(bindir)
    (cluster.work / "titan_train.py").write_text(TITAN_TRAIN)
    script = cluster.write_script("titan.slurm", TITAN_SCRIPT.replace("PORT", str(free_port())))
    torchrun = Path(sys.executable).parent / "torchrun"
    job_id = cluster.submit(script, env={"PATH": f"{bindir}:{torchrun.parent}:{os.environ['PATH']}"})
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=180)
    out = (cluster.work / f"air-{job_id}.out").read_text()
    assert job["state"] == "COMPLETED", out
    assert "Node IP: " in out and "Node IP: \n" not in out
    # (two ranks of one torchrun share its output, and may write their text and its newline apart)
    rows = sorted(re.findall(r"rank=\d+ world=\d+ local=\d+ sum=\d+ node=\d", out))
    assert [r.split()[:4] for r in rows] == [[f"rank={r}", "world=4", f"local={r % 2}", "sum=10"] for r in range(4)], out
    assert sorted({r.split()[4] for r in rows}) == ["node=0", "node=1"]


LIGHTNING_REQUEUE = r'''
import os, signal, sys, time
import torch
import pytorch_lightning as pl
from lightning_fabric.plugins.environments import SLURMEnvironment


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, index):
        if self.global_step == 5 and os.environ["SLURM_RESTART_COUNT"] == "0":
            print("ready for the signal", flush=True)
        time.sleep(0.1)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_start(self):
        print("training from step", self.global_step, flush=True)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[1],
                     plugins=[SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1)])
print("run", os.environ["SLURM_RESTART_COUNT"], flush=True)
trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=4))
print("finished at step", trainer.global_step, flush=True)
'''


def test_lightning_auto_requeue_on_sigusr1_requeues_and_resumes_from_its_hpc_checkpoint(cluster, tmp_path):
    """Lightning's own auto-requeue path: SIGUSR1 (as --signal=USR1@T sends it) makes Lightning save
    an hpc checkpoint and call scontrol requeue; the next run resumes from it and finishes."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cluster.cli("aircontrol", "slurm-commands", "install", "--dir", str(bindir))
    (cluster.work / "lightning_requeue.py").write_text(LIGHTNING_REQUEUE)
    root = cluster.work / "lightning-root"
    root.mkdir()
    script = cluster.write_script("lightning_requeue.sh", f"#!/bin/sh\n#SBATCH --ntasks-per-node=1\n"
                                                          f"srun {sys.executable} lightning_requeue.py {root}\n")
    job_id = cluster.submit(script, "-o", "lq-%j.out", env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    out = cluster.work / f"lq-{job_id}.out"
    wait_for(lambda: out.exists() and "ready for the signal" in out.read_text(), timeout=90, what="training to run")
    # as Slurm's scancel: to the step's task, not to the batch shell (which would die of it)
    subprocess.run([str(bindir / "scancel"), "-s", "USR1", str(job_id)], check=True, cwd=cluster.work,
                   env=dict(os.environ, AIR_CONF=str(cluster.config)), timeout=60)
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=180)
    text = out.read_text()
    assert job["state"] == "COMPLETED" and job["restart_count"] == 1, text
    assert "run 0" in text and "run 1" in text and "finished at step 48" in text, text
    assert "Requeuing SLURM job" not in text, text   # (its "failed with error code": scontrol requeue said no)
    assert list(root.glob("hpc_ckpt_*.ckpt")), text   # what Lightning saved, and resumed from
    starts = [int(line.split()[-1]) for line in text.splitlines() if line.startswith("training from step")]
    assert starts[0] == 0 and starts[1] >= 6, text
