"""A simulated month of a 256-node cluster through the controller's store code: does the store's file
level off, and does a submission stay fast at the end?

    python bench/bench_store.py [--days 30] [--write bench/RESULTS.md]

Each tick (--tick, 5 simulated minutes): jobs are submitted (Store.insert_job, timed), start and end (update_jobs, with
their event rows), every running job's rank 0 reports progress every --report-every seconds
(add_reports, as heartbeats bring them), flapping InfiniBand ports on a few nodes add health events
(add_node_events), and retention passes run until they find nothing left (airctld.retention, as its
thread runs them; each of its transactions timed from BEGIN to COMMIT: a submission waits at most one). Retention keeps jobs
--jobs-keep-days and events --events-keep-days, shorter than the defaults (365 and 30) so that the
steady state is reached within the month. The file's size is read at the end of each day.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from air.airctld import retention  # noqa: E402
from harness import report, table  # noqa: E402
from air.airctld.model import Job, NodeAlloc, evolve  # noqa: E402
from air.airctld.store import Store  # noqa: E402
from air.protos import air_pb2 as pb  # noqa: E402
from air.protos.states import JobPhase, JobResult, Reason  # noqa: E402

NODES = 256
GPUS = 8
DAY = 86400.0
SCRIPT = "#!/bin/bash\n#SBATCH -N 4 --gpus-per-node=8\nsrun python train.py --config big.yaml\n" + "# " * 400
REPORT = ('{"step": %d, "time": %.3f, "rank": 0, "loss": 2.345678, "tokens_per_s": 812345.6, '
          '"samples_per_s": 198.3, "mfu": 0.4123, "checkpoint_step": %d, "checkpoint_time": %.3f}')


class Sim:
    def __init__(self, store: Store, rng: random.Random, args):
        self.store, self.rng, self.args = store, rng, args
        self.running: dict[int, Job] = {}
        self.ends: dict[int, float] = {}
        self.submit_s: list[tuple[float, float]] = []      # (sim day, seconds)
        self.retention_s: list[float] = []                  # each retention transaction, BEGIN to COMMIT
        self._commits: list[float] | None = None
        store.on_commit_time = lambda s: self._commits.append(s) if self._commits is not None else None
        self.free_nodes = list(range(NODES))

    def submit(self, now: float) -> None:
        nodes = self.rng.choice((1, 1, 1, 2, 4, 8, 16))
        job = Job(job_id=0, uid=10_000 + self.rng.randrange(60), gid=100, user="u", name="train",
                  partition="gpu", num_nodes=nodes, gpus_per_node=GPUS, cpus_per_node=32, time_limit_s=86400 * 2,
                  submit_time=now, request=pb.JobRequest(script=SCRIPT, name="train", account="ml",
                                                         environment={"PATH": "/usr/bin", "HOME": "/home/u"}))
        began = time.perf_counter()
        with self.store.transaction():
            job_id = self.store.insert_job(job, job.uid)
        self.submit_s.append((now / DAY, time.perf_counter() - began))
        if len(self.free_nodes) >= nodes:   # start at once where it fits; else it is turned away (a full queue)
            taken = [self.free_nodes.pop() for _ in range(nodes)]
            old = evolve(job, job_id=job_id)
            new = evolve(old, phase=JobPhase.RUNNING, start_time=now, reason=Reason.NONE,
                         allocation=tuple(NodeAlloc(f"gpu{n:03d}", tuple(range(GPUS)), 32) for n in taken))
            with self.store.transaction():
                self.store.update_jobs([(old, new)], now, 0)
            self.running[job_id] = new
            hours = self.rng.expovariate(1 / self.args.mean_hours)
            self.ends[job_id] = now + min(hours * 3600, 2 * DAY)
        else:
            with self.store.transaction():
                old = evolve(job, job_id=job_id)
                self.store.update_jobs([(old, evolve(old, phase=JobPhase.DONE, result=JobResult.CANCELLED,
                                                     end_time=now, reason=Reason.CANCELLED))], now, 0)

    def tick(self, now: float) -> None:
        a = self.args
        for _ in range(_poisson(self.rng, a.jobs_per_day / DAY * a.tick)):
            self.submit(now + self.rng.random() * a.tick)
        rows = []
        for job_id, job in self.running.items():
            for k in range(int(a.tick / a.report_every)):
                t = now + k * a.report_every
                step = int((t - job.start_time) / 0.5)
                rows.append((job_id, t, REPORT % (step, t, step - step % 500, t - 120)))
        with self.store.transaction():
            self.store.add_reports(rows)
            for n in range(a.flapping_nodes):   # an erroring IB port: an event every few seconds
                self.store.add_node_events(f"gpu{n:03d}", [pb.HealthEvent(
                    gpu=-1, signal="IB mlx5_0/1 errors", message="symbol_error +3", critical=False, time=now + s)
                    for s in range(0, int(a.tick), 5)])
        ended = [j for j, end in self.ends.items() if end <= now + a.tick]
        if ended:
            changes = []
            for job_id in ended:
                old = self.running.pop(job_id)
                changes.append((old, evolve(old, phase=JobPhase.DONE, result=JobResult.COMPLETED,
                                            end_time=self.ends.pop(job_id), reason=Reason.NONE)))
                self.free_nodes += [int(alloc.node[3:]) for alloc in old.allocation]
            with self.store.transaction():
                self.store.update_jobs(changes, now + a.tick, 0)
        done = retention.Done(more=True)
        self._commits = self.retention_s
        while done.more:   # the maintenance thread's passes, back to back while work is left
            done = retention.run_pass(self.store, self.limits, now + a.tick, budget_s=0.0)   # one round
        self._commits = None

    @property
    def limits(self) -> retention.Limits:
        return retention.Limits(events_keep_s=self.args.events_keep_days * DAY,
                                jobs_keep_s=self.args.jobs_keep_days * DAY, report_sample_s=60.0)


def _poisson(rng: random.Random, mean: float) -> int:
    n, t = 0, rng.expovariate(1.0)
    while t < mean:
        n += 1
        t += rng.expovariate(1.0)
    return n


def _size(path: str) -> int:
    return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--jobs-per-day", type=float, default=4000)
    ap.add_argument("--mean-hours", type=float, default=2.0)
    ap.add_argument("--report-every", type=float, default=30.0, help="seconds between a running job's reports")
    ap.add_argument("--tick", type=float, default=300.0, help="simulated seconds between retention passes")
    ap.add_argument("--flapping-nodes", type=int, default=4)
    ap.add_argument("--jobs-keep-days", type=float, default=7)
    ap.add_argument("--events-keep-days", type=float, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--write", help="append the figures to this markdown file")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="air-bench-store-"))
    path = str(work / "air.db")
    store = Store(path)
    sim = Sim(store, random.Random(args.seed), args)
    sizes = []
    began = time.perf_counter()
    start = 1_800_000_000.0
    for day in range(args.days):
        for m in range(int(DAY // args.tick)):
            sim.tick(start + day * DAY + m * args.tick)
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        sizes.append(_size(path))
        counts = store.db.execute("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM reports), "
                                  "(SELECT count(*) FROM events), (SELECT count(*) FROM node_events)").fetchone()
        print(f"day {day + 1:2d}: {sizes[-1] / 1e6:7.1f} MB; jobs {counts[0]:,}, reports {counts[1]:,}, "
              f"events {counts[2]:,}, node events {counts[3]:,}; {len(sim.running)} running", flush=True)
    took = time.perf_counter() - began
    first = [s for d, s in sim.submit_s if d - start / DAY < 1]
    last = [s for d, s in sim.submit_s if d - start / DAY >= args.days - 1]
    week = min(7, args.days - 1)
    growth = (sizes[-1] - sizes[-1 - week]) / sizes[-1 - week] if week > 0 else float("nan")
    levels = growth < 0.05
    store.close()
    rows = [
        ("store file at the end (MB)", f"{sizes[-1] / 1e6:.1f}",
         f"day {args.days - week}: {sizes[-1 - week] / 1e6:.1f} MB; growth over the last {week} days "
         f"{growth * 100:+.1f}% ({'levels off' if levels else 'STILL GROWING'})"),
        ("size by day (MB)", " ".join(f"{s / 1e6:.0f}" for s in sizes), ""),
        ("submit latency, first day, p50 / p99 (ms)", f"{statistics.median(first) * 1e3:.2f} / "
         f"{_pct(first, 0.99) * 1e3:.2f}", f"{len(first)} submissions (insert and commit, fsynced)"),
        ("submit latency, last day, p50 / p99 / max (ms)", f"{statistics.median(last) * 1e3:.2f} / "
         f"{_pct(last, 0.99) * 1e3:.2f} / {max(last) * 1e3:.2f}", f"{len(last)} submissions"),
        ("retention transaction, p50 / p99 / max (ms)", f"{statistics.median(sim.retention_s) * 1e3:.2f} / "
         f"{_pct(sim.retention_s, 0.99) * 1e3:.2f} / {max(sim.retention_s) * 1e3:.2f}",
         f"{len(sim.retention_s):,} transactions; the longest a submission waits behind retention"),
        ("simulated month (s)", f"{took:.0f}", f"{len(sim.submit_s):,} jobs"),
    ]
    note = (f"{NODES} nodes x {GPUS} GPUs, {args.jobs_per_day:g} jobs a day (1 to 16 nodes, mean {args.mean_hours:g} h), a report per "
            f"running job every {args.report_every:g} s, retention every {args.tick:g} s, {args.flapping_nodes} nodes with an erroring IB port "
            f"(an event every 5 s); jobs kept {args.jobs_keep_days:g} days, events {args.events_keep_days:g} days, "
            "reports of ended jobs thinned to one a minute. No Slurm figure (slurmdbd's purge is not run by the "
            "peer)")
    report("store retention", table(["figure", "AIR", "note"], rows), args.write, note)
    for p in work.iterdir():
        p.unlink()
    work.rmdir()
    return 0 if levels else 1


if __name__ == "__main__":
    sys.exit(main())
