"""From a host's death to the first training step of the resumed job, with the default heartbeat
settings (a heartbeat every 2 s, a node DOWN after 15 s of silence).

    python bench/bench_resume.py [--runs 2] [--write bench/RESULTS.md]

A local cluster of 3 nodes; examples/tinygpt on 2 of them (2 ranks each, checkpoint every 5 steps).
Past step 20, one node "dies": kill -9 of its airnoded, of the job's processes there and of their
shepherds. The job is
requeued (airrun sees the node's stream break; else the node timeout), starts on the two nodes left
(the silent node takes no work until it is heard from again), restores its last checkpoint
and trains again. Measured: death -> requeued (detection), requeued -> first step logged by the
resumed run (restart: launch, Python and torch start, process group, restore), and the total.
Slurm's default SlurmdTimeout is 300 s before it even marks the node down.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import BIN, ROOT, LocalAir, report, table
from cluster import job_processes   # noqa: E402  (tests/cluster.py, on the path through harness)
TRAIN = ROOT / "examples" / "tinygpt" / "train.py"


def _cli(*args: str, env: dict) -> str:
    return subprocess.run([str(BIN / args[0]), *args[1:]], check=True, capture_output=True, text=True,
                          env=env).stdout


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def one_run() -> tuple[float, float]:
    import psutil
    with LocalAir(nodes=3, gpus_per_node=2, options=("--node-timeout", "15", "--heartbeat", "2"),
                  prefix="air-bench-resume-") as air:
        work, cluster = air.root, air.dir
        env = air.env
        log = work / "t.log"
        script = work / "t.sh"
        script.write_text(f"#!/bin/bash\nexec airrun python {TRAIN} --steps 400 --every 5 --sleep 0.05 --layers 2 "
                          f"--width 64 --heads 2 --block 32 --batch 4 --checkpoint-dir {work}/ckpt --log {log}\n")
        job = _cli("airbatch", "--parsable", "-N", "2", "--gpus-per-node=2", "--ntasks-per-node=2",
                   "-o", str(work / "t-%j.out"), str(script), env=env).strip()
        rank0 = Path(f"{log}.rank0")
        while _lines(rank0) < 20:
            time.sleep(0.2)
        info = json.loads(_cli("aircontrol", "show", "job", job, "--json", env=env))
        victim = info["nodes"][1]
        pids = [int(p) for p in (cluster / "pids").read_text().split()]
        daemon = pids[1 + int(victim[-2:]) - 1]
        doomed = job_processes(cluster / "spool", [job], victim)   # (this cluster's: others number jobs from 1 too)
        # a host's death takes the shepherds of the job's processes too (alive, one would report its
        # children's SIGKILL as the job's own failure)
        doomed += [p.parent() for p in doomed if p.parent() and "shepherd" in " ".join(p.parent().cmdline())]
        died = time.monotonic()
        os.kill(daemon, signal.SIGKILL)
        for p in doomed:
            try:
                p.kill()
            except psutil.Error:
                pass
        while json.loads(_cli("aircontrol", "show", "job", job, "--json", env=env))["restart_count"] < 1:
            time.sleep(0.05)
        requeued = time.monotonic()
        before = _lines(rank0)
        while _lines(rank0) <= before:
            time.sleep(0.05)
        resumed = time.monotonic()
        _cli("aircancel", job, env=env)
        return requeued - died, resumed - requeued


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--write")
    args = parser.parse_args()
    results = []
    for i in range(args.runs):
        detect, restart = one_run()
        results.append((detect, restart))
        print(f"run {i + 1}: job requeued after {detect:.1f} s; first resumed step "
              f"{restart:.1f} s later; {detect + restart:.1f} s in all", flush=True)
    best = min(results, key=lambda r: sum(r))
    worst = max(results, key=lambda r: sum(r))
    rows = [("host death -> job requeued (s)", f"{best[0]:.1f} - {worst[0]:.1f}",
             "airrun sees the node's stream break and exits 76; the controller requeues at once and keeps the job "
             "off the silent node; without airrun, the node timeout (15 s)"),
            ("requeued -> first resumed step (s)", f"{best[1]:.1f} - {worst[1]:.1f}",
             "launch, Python + torch start, gloo init, restore"),
            ("host death -> first resumed step (s)", f"{sum(best):.1f} - {sum(worst):.1f}", "target: under 15 s"),
            ("Slurm default, node marked DOWN (s)", "300", f"SlurmdTimeout; {300 / sum(worst):.0f}x longer "
             "before Slurm even starts to requeue")]
    report("resume after a host's death", table(["figure", "value", "note"], rows), args.write,
           "tinygpt on 2 of 3 local nodes (2 ranks each), kill -9 of one node's daemon and job processes past step "
           f"20; {args.runs} runs, best - worst")
    return 0


if __name__ == "__main__":
    sys.exit(main())
