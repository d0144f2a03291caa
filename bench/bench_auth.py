"""What identity costs: the same submissions with auth = "none" and with MUNGE credentials.

    python bench/bench_auth.py [--write bench/RESULTS.md]

Two local clusters on this machine, one per mode; a private munged with its own key serves
the MUNGE one. Every MUNGE call is one encode on the client and one decode on the server.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import LocalAir, api_submit, median_ms, report, table  # noqa: E402
from munged import Munged  # noqa: E402


def measure(air: LocalAir) -> dict[str, float]:
    cli = median_ms([air.tool("airbatch"), "-H", "-o", "/dev/null", "--wrap", "true"], air.env, 30)
    api_1, _ = api_submit(air.config, 1000, 1, hold=True, workdir=str(air.root))
    api_4, _ = api_submit(air.config, 1000, 4, hold=True, workdir=str(air.root))
    return {"cli_ms": cli, "api_1": api_1, "api_4": api_4}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write")
    args = parser.parse_args()
    munged = Munged().start()
    try:
        with LocalAir(options=("--auth", "none")) as air:
            none = measure(air)
        with LocalAir(options=("--auth", "munge", "--munge-socket", munged.socket)) as air:
            munge = measure(air)
    finally:
        munged.stop()
    rows = [
        ("airbatch wall time per call, median of 30 (ms)", f"{none['cli_ms']:.1f}", f"{munge['cli_ms']:.1f}",
         f"+{munge['cli_ms'] - none['cli_ms']:.1f} ms"),
        ("1,000 submissions through the API, 1 client (per s)", f"{none['api_1']:.0f}", f"{munge['api_1']:.0f}",
         f"{(none['api_1'] / munge['api_1'] - 1) * 100:+.0f}% time"),
        ("1,000 submissions through the API, 4 clients (per s)", f"{none['api_4']:.0f}", f"{munge['api_4']:.0f}",
         f"{(none['api_4'] / munge['api_4'] - 1) * 100:+.0f}% time"),
    ]
    report("cost of identity", table(["figure", "auth = none", "auth = munge", "cost of MUNGE"], rows), args.write,
           "no Slurm counterpart (Slurm always uses MUNGE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
