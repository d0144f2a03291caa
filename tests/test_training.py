"""The runtime's promise on a real cluster, with examples/tinygpt: interrupted twice (a preemption, then
kill -9 of a node daemon with its ranks), a 2-node x 2-rank run ends bit-identical to an uninterrupted
one, having trained on exactly the same batches. Also: the time-limit warning checkpoints and requeues
with the real reason, a hung job is ended with its stacks in its output, and airq -l shows progress."""
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from cluster import wait_for

pytestmark = pytest.mark.serial   # (its torch ranks take both cores: run alone, see scripts/test.sh)

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "tinygpt" / "train.py"
SMALL = ["--layers", "2", "--width", "64", "--heads", "2", "--block", "32", "--batch", "4"]
EXTRA = """
[scheduler]
preempt_grace_s = 30.0

[[qos]]
name = "normal"

[[qos]]
name = "high"
priority = 10
preempt = ["normal"]
"""


CLUSTER = dict(extra_config=EXTRA)


def _tinygpt_job(cluster, name: str, steps: int, *options: str, every: int = 5, sleep: float = 0.1,
                 ranks: int = 2, nodes: int = 2) -> tuple[int, Path]:
    out = cluster.work / name
    launch = f"exec airrun python {TRAIN}" if nodes * ranks > 1 else f"exec {sys.executable} {TRAIN}"
    script = cluster.write_script(f"{name}.sh", f"#!/bin/bash\n{launch} --steps {steps} --every {every} "
                                  f"--sleep {sleep} {' '.join(SMALL)} --checkpoint-dir {out}-ckpt "
                                  f"--log {out}.log --out {out}.pt\n")
    job = cluster.submit(script, f"--nodes={nodes}", "--gpus-per-node=2", f"--ntasks-per-node={ranks}",
                         "-o", f"{name}-%j.out", *options)
    return job, out


def _steps_logged(out: Path, rank: int = 0) -> int:
    log = Path(f"{out}.log.rank{rank}")
    return len(log.read_text().splitlines()) if log.exists() else 0


def _last_step(out: Path, rank: int = 0) -> int:
    lines = Path(f"{out}.log.rank{rank}").read_text().splitlines()
    return int(lines[-1].split()[0]) if lines and lines[-1].split() else 0


def _history(out: Path, rank: int) -> dict[int, str]:
    """step -> the batch the run that counted used (a step run again after a crash replaces the first)."""
    steps = {}
    for line in Path(f"{out}.log.rank{rank}").read_text().splitlines():
        step, idx = line.split()
        steps[int(step)] = idx
    return steps


def _hms(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60:02d}:{m % 60:02d}:{s:02d}"


def test_interrupted_twice_ends_bit_identical_to_an_uninterrupted_run(cluster):
    steps = 60
    # the reference runs beside it, on the other half of each node's GPUs, in a QOS the preemptor may
    # not preempt
    base, base_out = _tinygpt_job(cluster, "base", steps, "--qos=high")
    job, out = _tinygpt_job(cluster, "interrupted", steps)
    cluster.wait_state(job, "RUNNING")
    wait_for(lambda: _steps_logged(out) >= 8, timeout=90, what="training to pass step 8")
    # progress as the user sees it
    row = wait_for(lambda: (r := cluster.queue("-j", str(job))[0])["progress"] and
                   r["progress"].get("checkpoint_step") and r, timeout=20, what="a progress report")
    assert row["progress"]["step"] >= 5 and row["progress"]["tokens_per_s"] > 0
    long = cluster.cli("airq", "-l", "-j", str(job)).stdout.splitlines()
    assert long[0].split()[7:14] == ["STEP", "LOSS", "TOK/S", "MFU", "LAST_CKPT", "RESTARTS", "NODELIST(REASON)"]
    assert long[1].split()[4] == "R" and "@" in long[1].split()[11]   # the last checkpoint: its step and age

    # interruption 1: a preempting job takes the GPUs it holds; the run stops at an agreed step with a checkpoint
    boss = cluster.submit(cluster.write_script("boss.sh", "#!/bin/sh\nsleep 2\n"), "--nodes=2",
                          "--gpus-per-node=2", "--qos=high")
    cluster.wait_state(boss, "RUNNING", "COMPLETED", timeout=60)
    record = cluster.job(job)
    assert record["restart_count"] == 1 and record["last_stop_reason"] == "Preempted"
    text = (cluster.work / f"interrupted-{job}.out").read_text()
    assert "(Preempted); checkpoint written" in text
    stopped_at = _steps_logged(out)

    # interruption 2: node01 crashes: its daemon, the job's processes there and their shepherds die;
    # no chance to checkpoint
    cluster.wait_state(job, "RUNNING", timeout=60)
    assert cluster.wait_state(base, "COMPLETED", "FAILED", timeout=180)["state"] == "COMPLETED"
    assert cluster.job(base)["restart_count"] == 0
    # two or three steps past a checkpoint (every 5): the crash loses work that the next run computes again
    wait_for(lambda: _steps_logged(out) >= stopped_at + 10, timeout=90, what="the resumed run to train on")
    ranks = cluster.job_processes([job], "node01")
    assert ranks
    wait_for(lambda: _last_step(out) % 5 in (2, 3), timeout=30, interval=0.005, what="a step past a checkpoint")
    # freeze node01's side at once: the whole run waits on it, so no checkpoint can be written while the
    # crash below looks for every process to kill (a scan that takes longer than a few steps)
    for p in ranks:
        try:
            p.suspend()
        except psutil.Error:
            pass
    assert _last_step(out) % 5 in (2, 3, 4)
    cluster.crash_host(0, [job])
    cluster.start_node(0)
    wait_for(lambda: cluster.job(job)["restart_count"] == 2, timeout=30, what="the job to be requeued")
    # the daemon came back before the node timeout: its job is gone from it (JobLost), else NodeFail
    assert cluster.job(job)["last_stop_reason"] in ("JobLost", "NodeFail")
    done = cluster.wait_state(job, "COMPLETED", "FAILED", "NODE_FAIL", timeout=180)
    assert done["state"] == "COMPLETED", (done, (cluster.work / f"interrupted-{job}.out").read_text()[-3000:])

    final, reference = torch.load(f"{out}.pt"), torch.load(f"{base_out}.pt")
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[k], reference[k]) for k in reference)
    for rank in range(4):
        history, expected = _history(out, rank), _history(base_out, rank)
        assert sorted(history) == list(range(1, steps + 1))
        assert history == expected   # the same batch at every step: none skipped, none repeated
    shown = cluster.cli("aircontrol", "show", "job", str(job)).stdout
    assert "Restarts=2" in shown and "LastStopReason=" in shown

    # goodput against what happened: the steps rank 0 computed twice (its log has a line for every step
    # it computed, each run's), and the time between runs (airacct's run records)
    g = cluster.job(job)["goodput"]
    redone = _steps_logged(out) - steps
    assert g["runs"] == 3 and not g["partial"], g
    assert redone >= 1 and g["lost_steps"] in (redone - 1, redone), (g, redone)   # (a kill between log and report)
    assert g["lost_s"] > 0 and g["restoring_s"] > 0 and g["checkpoint_s"] > 0 and g["starting_s"] > 0, g
    computed = _steps_logged(out) - 3   # every step but each run's first (starting) slept 0.1 s in its loop
    assert g["training_s"] + g["lost_s"] >= 0.1 * computed, (g, computed)
    lines = cluster.cli("airacct", "-j", str(job), "-D", "-X", "-n", "-P", "-o", "Start,End,ElapsedRaw").stdout.split()
    runs = [line.split("|") for line in lines]
    assert len(runs) == 3, lines
    stamps = [(time.mktime(time.strptime(a, "%Y-%m-%dT%H:%M:%S")), time.mktime(time.strptime(b, "%Y-%m-%dT%H:%M:%S")))
              for a, b, _ in runs]
    gaps = sum(stamps[i + 1][0] - stamps[i][1] for i in range(2))
    assert abs(g["down_s"] - gaps) <= 2.0, (g["down_s"], gaps, runs)   # (airacct's times are whole seconds)
    parts = sum(g[f"{c}_s"] for c in ("starting", "restoring", "training", "checkpoint", "lost", "down", "other"))
    assert abs(parts - g["wall_s"]) < 0.01 and 0 < g["ettr"] < 1 and abs(g["ettr"] - g["training_s"] / g["wall_s"]) < 1e-3
    assert g["wall_s"] == pytest.approx(stamps[-1][1] - stamps[0][0], abs=2.0)
    row = cluster.cli("airacct", "-j", str(job), "-X", "-n", "-P", "-o", "JobID,Goodput,LostSteps,LostWork").stdout
    # (the JSON's ettr is rounded to 4 places, airacct prints the exact one to 1: they may differ by a tenth)
    shown_job, shown_ettr, shown_lost, shown_work = row.strip().split("|")
    assert (shown_job, shown_lost, shown_work) == (str(job), str(g["lost_steps"]), _hms(g["lost_s"])), row
    assert shown_ettr.endswith("%") and abs(float(shown_ettr[:-1]) - g["ettr"] * 100) <= 0.051, (row, g["ettr"])
    row = cluster.cli("airq", "-l", "-t", "all", "-j", str(job), "-h").stdout.split()
    assert row[12].startswith("2:")


def test_time_limit_warning_checkpoints_requeues_and_finishes(cluster, tmp_path):
    # 21 s of steps: more than a run has before its warning (20 s, less its start), and about two runs'
    # worth where starting takes up to 8 s (torch's import on a busy 2-core host)
    steps = 84
    job, out = _tinygpt_job(cluster, "warned", steps, "--time=0:32", "--signal=TERM@12", every=1000,
                            sleep=0.25, ranks=1, nodes=1)
    done = cluster.wait_state(job, "COMPLETED", "FAILED", "TIMEOUT", timeout=240)
    text = (cluster.work / f"warned-{job}.out").read_text()
    assert done["state"] == "COMPLETED" and done["restart_count"] >= 1, (done["exit_code"], done["exit_signal"], done["reason_detail"], text[-2000:])
    assert done["last_stop_reason"] == "TimeLimit"
    assert "(TimeLimit); checkpoint written" in text
    # the same result as one run of all the steps
    subprocess.run([sys.executable, str(TRAIN), "--steps", str(steps), "--every", "1000", *SMALL,
                    "--checkpoint-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "ref.pt")],
                   check=True, capture_output=True, timeout=300)
    final, reference = torch.load(f"{out}.pt"), torch.load(tmp_path / "ref.pt")
    assert all(torch.equal(final[k], reference[k]) for k in reference)


def test_a_job_that_stops_making_progress_ends_hung_with_its_stacks(cluster):
    script = cluster.write_script("stuck.py", "import time\nfrom air import runtime\nctx = runtime.init()\n"
                                  "for step in range(1, 4):\n    ctx.report(step, loss=1.0 / step)\n"
                                  "    time.sleep(0.2)\n"
                                  "def wait_for_a_peer_that_never_answers():\n    time.sleep(600)\n"
                                  "wait_for_a_peer_that_never_answers()\n")
    batch = cluster.write_script("stuck.sh", f"#!/bin/sh\nexec {sys.executable} {script}\n")
    began = time.monotonic()
    # the timeout must outlast the runtime's start (importing torch takes 3-5 s on a busy 2-core host)
    job = cluster.submit(batch, "--hang-timeout=0:08", "--no-requeue", "-o", "stuck-%j.out")
    done = cluster.wait_state(job, "HUNG", "COMPLETED", "FAILED", timeout=40)
    assert done["state"] == "HUNG" and done["reason"] == "Hung" and "no progress for" in done["reason_detail"]
    assert time.monotonic() - began < 25
    text = (cluster.work / f"stuck-{job}.out").read_text()
    assert "wait_for_a_peer_that_never_answers" in text and "stuck.py" in text   # faulthandler's stacks
    assert cluster.cli("airq", "-j", str(job), "-h", "-t", "all", "-o", "%t").stdout.strip() == "HG"
    import json
    series = json.loads(cluster.cli("airstat", str(job), "--json").stdout)   # sampled at each heartbeat
    assert series["step"][-1] == 3 and series["loss"][-1] == pytest.approx(1 / 3)
    drawn = cluster.cli("airstat", str(job), "--width", "60").stdout
    assert f"job {job}: loss by step" in drawn and "step" in drawn and "\x1b[" not in drawn   # no colours in a pipe
