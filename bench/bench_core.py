"""Core benchmarks: AIR on a local cluster, and the real Slurm of ../shared/peers/slurm/, in one run.

    python bench/bench_core.py [--jobs 100000] [--no-slurm] [--write bench/RESULTS.md]

Prints one line per figure with the Slurm figure and the ratio where Slurm does the same work.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from harness import SLURM, LocalAir, api_submit, median_ms, ratio, report, table, timed

def _sh(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kw)


# ---------------------------------------------------------------- AIR

class Air(LocalAir):
    def __init__(self):
        super().__init__(nodes=2, gpus_per_node=4, cpus_per_node=64)

    def queue_empty(self) -> bool:
        """Whether no job is pending, running or completing: asked through the API from this process, so
        that the polling costs the two cores next to nothing (an airq process every few ms took about
        half of one core from the jobs being measured)."""
        from air.aircli.client import Client
        from air.protos import air_pb2 as pb
        if not hasattr(self, "_client"):
            self._client = Client(self.config)
        phases = [pb.JOB_PHASE_PENDING, pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_COMPLETING]
        return not self._client.list_jobs(pb.JobFilter(phases=phases, rendered=True)).rendered

    def daemons(self) -> list[tuple[str, object]]:
        """The cluster's airctld and airnoded processes (psutil), each with its kind: those `aircontrol
        local up` started and recorded in its pids file, airctld first."""
        import psutil
        pids = [int(pid) for pid in (self.dir / "pids").read_text().split()]
        return [("airctld" if i == 0 else "airnoded", psutil.Process(pid)) for i, pid in enumerate(pids)]

    def start_latency(self, runs: int = 5) -> float:
        marks = []
        for i in range(runs):
            mark = self.root / f"start-{i}"
            t = time.time()
            self.cli("airbatch", "-o", "/dev/null", "--wrap", f"date +%s.%N > {mark}")
            while not (mark.exists() and mark.read_text().strip()):
                time.sleep(0.002)
            marks.append(float(mark.read_text()) - t)
        return statistics.median(marks)

    def start_latency_api(self, runs: int = 9) -> float:
        """The same, submitting through the API: the system's own latency, without the CLI's start-up."""
        from air.aircli.client import Client
        from air.protos import air_pb2 as pb
        client = Client(self.config)
        marks = []
        for i in range(runs):
            mark = self.root / f"api-start-{i}"
            req = pb.SubmitRequest(job=pb.JobRequest(
                name="latency", script=f"#!/bin/sh\ndate +%s.%N > {mark}\n", workdir=str(self.root),
                output="/dev/null", nodes=1, ntasks_per_node=1, cpus_per_task=1))
            t = time.time()
            client.submit(req)
            while not (mark.exists() and mark.read_text().strip()):
                time.sleep(0.001)
            marks.append(float(mark.read_text()) - t)
        return statistics.median(marks)

    def drain(self, jobs: int, clients: int = 4) -> float:
        """Jobs per second from the first submission (as Slurm's figure, from its first sbatch) until
        none is left pending, running or completing."""
        _, t = api_submit(self.config, jobs, clients, hold=False, workdir=str(self.root))
        while not self.queue_empty():
            time.sleep(0.02)
        return jobs / (time.perf_counter() - t)

    def cli_submit_ms(self, runs: int = 30) -> float:
        return median_ms([self.tool("airbatch"), "-H", "-o", "/dev/null", "--wrap", "true"], self.env, runs)

    def airq_ms(self, runs: int = 7, *args: str) -> float:
        return median_ms([self.tool("airq"), *args], self.env, runs)

    def cancel_user_s(self) -> float:
        return timed([self.tool("aircancel"), "-u", os.environ.get("USER", "root") if os.getuid() else "root"],
                     self.env)


def python_floor_ms(runs: int = 20) -> tuple[float, float]:
    """Interpreter start alone, and start plus importing what airbatch imports before its RPC."""
    bare = median_ms([sys.executable, "-c", "pass"], runs=runs)
    imports = median_ms([sys.executable, "-c", "import air.aircli.batch, air.aircli.client, air.aircli.wire, "
                                                "air.protos.config, air.protos.credential, air.protos.schemas"],
                        runs=runs)
    return bare, imports


def _cpu(daemons: list) -> dict[str, float]:
    """CPU seconds so far: of airctld, of the node daemons themselves, and of what the node daemons reaped
    (each run's C shepherd, and through it the job's processes; a Python shepherd's spawner reaps its
    own, up to a second later, and is not counted). A daemon gone meanwhile is a failed drain."""
    import psutil
    spent = {"airctld": 0.0, "airnoded": 0.0, "children": 0.0}
    for kind, proc in daemons:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            raise SystemExit(f"bench_core: {kind} (pid {proc.pid}) ended during the drains") from None
        spent[kind] += times.user + times.system
        if kind == "airnoded":
            spent["children"] += times.children_user + times.children_system
    return spent


# ---------------------------------------------------------------- Slurm

def slurm_measure(n: int) -> dict[str, float]:
    _sh("bash", str(SLURM / "up.sh"))
    out = _sh("bash", str(SLURM / "measure.sh"), str(n)).stdout
    return {k: float(v) for k, v in (line.split() for line in out.splitlines() if line.strip())}


def slurm_large(n: int, parallel: int = 8) -> dict[str, float]:
    """Fill Slurm with n held jobs, then time squeue and scancel -u, as AIR's large-queue figures do."""
    per = n // parallel
    loop = f"for i in $(seq {per}); do sbatch -H -o /dev/null --wrap true >/dev/null; done"
    procs = [subprocess.Popen(["bash", "-c", loop]) for _ in range(parallel)]
    for p in procs:
        p.wait()
    squeue = median_ms(["squeue"], runs=5)
    scancel = timed(["scancel", "-u", "root"])
    while _sh("squeue", "-h").stdout.strip():
        time.sleep(1)
    return {"squeue_large_ms": squeue, "scancel_large_s": scancel, "large_jobs": per * parallel}


def slurm_down():
    subprocess.run(["bash", str(SLURM / "down.sh")], capture_output=True)


# ---------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in the store for the airq/cancel figures")
    parser.add_argument("--drain", type=int, default=300)
    parser.add_argument("--no-slurm", action="store_true")
    parser.add_argument("--slurm-large", action="store_true", help="also fill Slurm with --jobs held jobs")
    parser.add_argument("--write", help="append the results to this markdown file")
    parser.add_argument("--drains-only", type=int, default=0, metavar="N",
                        help="only the trivial jobs' throughput: N drains of --drain jobs on one cluster, each printed")
    args = parser.parse_args()
    if args.drains_only:
        with Air() as air:
            daemons = air.daemons()
            for i in range(args.drains_only):
                before = _cpu(daemons)
                rate = air.drain(args.drain)
                spent = {k: (v - before[k]) / args.drain * 1000 for k, v in _cpu(daemons).items()}
                print(f"drain {i + 1}: {args.drain} trivial jobs at {rate:.0f}/s; CPU a job: airctld "
                      f"{spent['airctld']:.2f} ms, node daemons {spent['airnoded']:.2f} ms, their shepherds and "
                      f"jobs {spent['children']:.2f} ms", flush=True)
        return 0

    rows: list[tuple[str, str, str, str, str]] = []   # figure, AIR, Slurm, ratio, target
    slurm: dict[str, float] = {}
    if not args.no_slurm:
        print("slurm: measuring ...", flush=True)
        slurm = slurm_measure(args.drain)
        if args.slurm_large:
            slurm.update(slurm_large(args.jobs))
        slurm_down()
        print(f"slurm: {slurm}", flush=True)

    with Air() as air:
        api, _ = api_submit(air.config, 4000, 4, hold=True, workdir=str(air.root))
        air.cli("aircancel", "-u", "root")
        latency = air.start_latency()
        latency_api = air.start_latency_api()
        drain = air.drain(args.drain)
        cli_ms = air.cli_submit_ms()
        bare_ms, import_ms = python_floor_ms()
        air.cli("aircancel", "-u", "root")
        fill, _ = api_submit(air.config, args.jobs, 4, hold=True, workdir=str(air.root))
        airq = air.airq_ms()
        # the same rows through -o, which airq renders itself from the jobs (as every airq did before
        # the controller kept the default rows rendered)
        airq_client = air.airq_ms(7, "-o", "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R")
        cancel = air.cancel_user_s()

    s = slurm.get
    rows.append(("submissions/s, API, 4 clients, held, durable", f"{api:.0f}", "-", "-", "1,000/s"))
    rows.append((f"submissions/s, API, 4 clients ({args.jobs:,} held)", f"{fill:.0f}", "-", "-", "1,000/s"))
    rows.append(("submit-to-start latency, airbatch command, median of 5 (s)", f"{latency:.3f}",
                 f"{s('start_s'):.3f}" if s("start_s") else "-", ratio(latency, s("start_s"), False), "< 0.1 s"))
    rows.append(("submit-to-start latency through the API, median of 9 (s)", f"{latency_api:.3f}", "-", "-",
                 "< 0.1 s"))
    rows.append((f"{args.drain} trivial jobs submitted and finished (jobs/s)", f"{drain:.0f}",
                 f"{s('drain_jobs_s'):.1f}" if s("drain_jobs_s") else "-", ratio(drain, s("drain_jobs_s"), True),
                 "250/s"))
    rows.append((f"airq wall time, {args.jobs:,} jobs (ms)", f"{airq:.0f}",
                 f"{s('squeue_large_ms'):.0f}" if s("squeue_large_ms") else "-",
                 ratio(airq, s("squeue_large_ms"), False), "< 200 ms"))
    rows.append((f"airq -o with the default format (rows rendered by airq), {args.jobs:,} jobs (ms)",
                 f"{airq_client:.0f}", "-", "-", "the plain airq's rows are kept rendered by airctld"))
    rows.append((f"aircancel -u, {args.jobs:,} pending jobs (s)", f"{cancel:.2f}",
                 f"{s('scancel_large_s'):.1f}" if s("scancel_large_s") else "-",
                 ratio(cancel, s("scancel_large_s"), False), "< 2 s"))
    rows.append(("airbatch wall time per call (ms)", f"{cli_ms:.1f}",
                 f"{s('submit_ms'):.2f}" if s("submit_ms") else "-", ratio(cli_ms, s("submit_ms"), False),
                 f"floor: python start {bare_ms:.0f} ms, imports {import_ms:.0f} ms"))

    note = ("AIR only (--no-slurm)" if args.no_slurm else "Slurm 22.05 from ../shared/peers/slurm on the same "
            f"machine, same run{'' if args.slurm_large else ' (Slurm large-queue figures not run)'}")
    report("core", table(["figure", "AIR", "Slurm", "AIR vs Slurm", "target / note"], rows), args.write, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
