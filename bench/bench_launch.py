"""Rank launch latency (airrun called -> every rank running) and the cost of node health checks.

    python bench/bench_launch.py [--no-slurm] [--write bench/RESULTS.md]

AIR: 2 nodes x 4 ranks, and 16 simulated hosts on loopback x 8 ranks; 1 node x 8 ranks beside
Slurm's `srun -n 8` on the peer's one node. Health: CPU time of one check of a node with 8
simulated GPUs and 8 InfiniBand ports, as a share of one core at the default 5 s interval.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, SLURM, LocalAir, report, table

RANK_MARK = 'date +%s.%N > "$MARKS/r.$RANK$SLURM_PROCID"'


def _latency(marks: Path, ranks: int, timeout: float = 120) -> float:
    deadline = time.time() + timeout
    while len([p for p in marks.glob("r.*") if p.read_text().strip()]) < ranks or not (marks / "t0").exists() \
            or not (marks / "t0").read_text().strip():
        if time.time() > deadline:
            raise RuntimeError(f"only {len(list(marks.glob('r.*')))} of {ranks} ranks reported")
        time.sleep(0.05)
    t0 = float((marks / "t0").read_text())
    return max(float(p.read_text()) for p in marks.glob("r.*")) - t0


def _median_launch(work: Path, runs: int, ranks: int, directive: str, launcher: str, submit: list[str],
                   env: dict) -> float:
    """Submit `runs` batch scripts that launch `ranks` ranks with `launcher`; the median latency."""
    results = []
    for i in range(runs):
        marks = work / f"m{i}"
        marks.mkdir()
        script = work / f"launch{i}.sh"
        script.write_text(f"#!/bin/sh\n{directive}\nexport MARKS={marks}\n"
                          f"date +%s.%N > $MARKS/t0.tmp; mv $MARKS/t0.tmp $MARKS/t0\n"
                          f"{launcher} sh -c '{RANK_MARK}'\n")
        subprocess.run([*submit, "-o", "/dev/null", str(script)], check=True, env=env, capture_output=True, cwd=work)
        results.append(_latency(marks, ranks))
    return statistics.median(results)


def air_launch(nodes: int, per_node: int, runs: int) -> float:
    with LocalAir(nodes=nodes, gpus_per_node=per_node, cpus_per_node=64, options=("--node-timeout", "30"),
                  prefix="air-bench-launch-") as air:
        return _median_launch(air.root, runs, nodes * per_node, f"#AIR -N {nodes} --gpus-per-node={per_node}",
                              "airrun", [air.tool("airbatch")], air.env)


def slurm_launch(tasks: int, runs: int) -> float:
    subprocess.run(["bash", str(SLURM / "up.sh")], check=True, capture_output=True)
    work = Path(tempfile.mkdtemp(prefix="slurm-bench-launch-"))
    os.chmod(work, 0o755)
    try:
        return _median_launch(work, runs, tasks, f"#SBATCH -n {tasks}", "srun", ["sbatch"], dict(os.environ))
    finally:
        subprocess.run(["bash", str(SLURM / "down.sh")], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def health_cost(checks: int = 200) -> tuple[float, float]:
    """(CPU ms per check without a health program, with a trivial one)."""
    sys.path.insert(0, str(ROOT))
    from air.airnoded.gpus import SimulatedGpus
    from air.airnoded.health import HealthMonitor
    root = Path(tempfile.mkdtemp(prefix="air-bench-ib-"))
    try:
        for dev in range(8):
            port = root / f"mlx5_{dev}" / "ports" / "1"
            port.mkdir(parents=True)
            (port / "state").write_text("4: ACTIVE\n")
        out = []
        for program in ("", "/bin/true"):
            monitor = HealthMonitor("n", SimulatedGpus(8, "n"), root, program, 5.0, 10.0, lambda e: None)
            cpu0 = time.process_time()
            children0 = os.times().children_user + os.times().children_system
            for _ in range(checks):
                monitor.check(time.time())
            children = os.times().children_user + os.times().children_system - children0
            out.append((time.process_time() - cpu0 + children) / checks * 1000)
        return out[0], out[1]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-slurm", action="store_true")
    parser.add_argument("--write")
    args = parser.parse_args()
    srun = None if args.no_slurm else slurm_launch(8, args.runs)
    one = air_launch(1, 8, args.runs)
    two = air_launch(2, 4, args.runs)
    sixteen = air_launch(16, 8, args.runs)
    bare, program = health_cost()
    rows = [
        ("rank launch, 1 node x 8 ranks (s)", f"{one:.3f}", f"{srun:.3f}" if srun else "-",
         f"{srun / one:.1f}x" if srun else "-"),
        ("rank launch, 2 nodes x 4 ranks (s)", f"{two:.3f}", "-", "-"),
        ("rank launch, 16 hosts x 8 ranks on loopback (s)", f"{sixteen:.3f}", "-", "-"),
        ("health check CPU per node per 5 s interval, 8 GPUs + 8 IB ports (% of a core)",
         f"{bare / 5000 * 100:.4f}%", "-", "-"),
        ("the same with a health program (/bin/true) each interval (% of a core)",
         f"{program / 5000 * 100:.3f}%", "-", "-"),
    ]
    report("rank launch and health checks", table(["figure", "AIR", "Slurm", "AIR vs Slurm"], rows), args.write,
           f"median of {args.runs} runs; launch latency is from the batch script calling airrun (srun) to the last "
           "rank's first line. The Slurm peer has one node, so only 1 x 8 has a Slurm figure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
