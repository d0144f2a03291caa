"""What a run's shepherd costs: one trivial child (/bin/true) started by a shepherd, followed to its
end, with the node's spawner (the daemon's way) and with a shepherd that starts a Python of its own
(the way without a spawner), one after the other in the same run.

    python bench/bench_shepherd.py [--runs 50] [--write bench/RESULTS.md]

Before shepherds, the daemon forked the job itself; a node daemon restart then killed every job.
No Slurm counterpart is measured (slurmd starts a slurmstepd, a C program, for each job step).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from air.airnoded import shepherding  # noqa: E402
from harness import report, table  # noqa: E402


def one_run(folder: Path, spawner) -> None:
    folder.mkdir()
    r, w = os.pipe()
    try:
        herd = shepherding.spawn(folder, "batch", [shepherding.Child(["/bin/true"], {}, w, w)], None, os.getgid(),
                                 [os.getgid()], None, spawner=spawner)
    finally:
        os.close(w)
    herd.wait()
    os.close(r)
    if herd.exits.get(0) != 0:
        raise SystemExit(f"the child did not exit 0: {herd.exits}")


def per_run_ms(base: Path, runs: int, spawner) -> float:
    start = time.perf_counter()
    for i in range(runs):
        one_run(base / f"job{i}.0", spawner)
    return (time.perf_counter() - start) / runs * 1000


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--write")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="air-bench-shepherd-"))
    os.chmod(base, 0o755)
    spawner = shepherding.Spawner(base)
    try:
        (base / "a").mkdir()
        (base / "b").mkdir()
        with_spawner = per_run_ms(base / "a", args.runs, spawner)
        without = per_run_ms(base / "b", args.runs, None)
    finally:
        spawner.close()
    rows = [("trivial run with its shepherd, forked by the spawner (ms)", f"{with_spawner:.1f}"),
            ("trivial run with a shepherd that starts its own Python (ms)", f"{without:.1f}")]
    report("what a run's shepherd costs", table(["figure", "value"], rows), args.write,
           f"mean of {args.runs} runs, each from the request to the child's recorded exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
