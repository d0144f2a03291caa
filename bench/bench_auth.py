"""What identity costs: the same submissions with auth = "none" and with MUNGE credentials.

    python bench/bench_auth.py [--write bench/RESULTS.md]

Two local clusters on this machine, one per mode; a private munged with its own key serves
the MUNGE one. Every MUNGE call is one encode on the client and one decode on the server.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_core import BIN, _timed, api_submit  # noqa: E402
from munged import Munged  # noqa: E402


def cluster(base: str, root: Path, options: list[str]) -> str:
    subprocess.run([str(BIN / "aircontrol"), "local", "up", "--dir", str(root), "--nodes", "2",
                    "--base-address", base, *options], check=True, capture_output=True)
    return str(root / "air.toml")


def measure(config: str, workdir: str) -> dict[str, float]:
    env = dict(os.environ, AIR_CONF=config)
    cli = statistics.median(_timed([str(BIN / "airbatch"), "-H", "-o", "/dev/null", "--wrap", "true"], env)
                            for _ in range(30)) * 1000
    api_1, _ = api_submit(config, 1000, 1, hold=True, workdir=workdir)
    api_4, _ = api_submit(config, 1000, 4, hold=True, workdir=workdir)
    return {"cli_ms": cli, "api_1": api_1, "api_4": api_4}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="air-bench-auth-"))
    munged = Munged().start()
    try:
        none = measure(cluster("127.0.7.1", work / "none", ["--auth", "none"]), str(work))
        munge = measure(cluster("127.0.8.1", work / "munge", ["--auth", "munge", "--munge-socket", munged.socket]),
                        str(work))
    finally:
        for d in ("none", "munge"):
            subprocess.run([str(BIN / "aircontrol"), "local", "down", "--dir", str(work / d)], capture_output=True)
        munged.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = [
        ("airbatch wall time per call, median of 30 (ms)", f"{none['cli_ms']:.1f}", f"{munge['cli_ms']:.1f}",
         f"+{munge['cli_ms'] - none['cli_ms']:.1f} ms"),
        ("1,000 submissions through the API, 1 client (per s)", f"{none['api_1']:.0f}", f"{munge['api_1']:.0f}",
         f"{(none['api_1'] / munge['api_1'] - 1) * 100:+.0f}% time"),
        ("1,000 submissions through the API, 4 clients (per s)", f"{none['api_4']:.0f}", f"{munge['api_4']:.0f}",
         f"{(none['api_4'] / munge['api_4'] - 1) * 100:+.0f}% time"),
    ]
    table = ("| figure | auth = none | auth = munge | cost of MUNGE |\n|---|---|---|---|\n"
             + "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows))
    print(table)
    if args.write:
        with open(args.write, "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: cost of identity\n\n"
                    f"`python bench/bench_auth.py {' '.join(sys.argv[1:])}` on {os.cpu_count()} cores; no Slurm "
                    "counterpart (Slurm always uses MUNGE).\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
