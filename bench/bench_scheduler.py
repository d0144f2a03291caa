"""The scheduler at scale, and what backfill buys, with the real scheduling code.

    python bench/bench_scheduler.py [--quick] [--sizes NxP,...] [--before REV] [--write bench/RESULTS.md]

1. One full pass (fairshare over the account tree, multifactor priority of every pending job,
   then the scheduler: limits, placement, reservations and backfill) on 1,000, 4,000 and
   10,000 nodes of 8 GPUs with 10,000, 50,000 and 100,000 pending jobs. The cluster is 90% busy
   with running jobs that have time limits, and the queue is a mix of 1- to 64-node jobs,
   so every pass makes reservations and backfills. Best of three passes on fresh copies, three
   ways: with the code of commit REV (--before, its airctld and protos taken from git and run in a
   child process), then with this tree's pass with its priority cache empty (what filling it costs,
   which a controller does once as it starts, before its first pass: airctld/passes.py prime), and
   with this tree's pass 10 s of cluster time after another (the cache warm, as in a running
   controller and in its first pass); every measured pass is at the same cluster time. `--sizes 10000x100000` picks sizes.
2. GPU utilisation over a simulated day of a mixed trace (1- to 64-node jobs, runtimes from
   minutes to hours, time limits above the runtimes, 5% of them in a QOS that preempts the rest)
   on 256 nodes, with and without backfill, with this scheduler and with the one of commit REV
   (--before, loaded from git): also how much later the first waiting job could start because of
   each pass's backfill (must be 0), and the preemptions (most by one preemptor of one victim).

Slurm does not run here at these sizes; its default backfill looks at 500 jobs per 30 s cycle
(bf_max_job_test=500, bf_interval=30), which is the figure to compare the pass time with.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import random
import subprocess
import tempfile
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("AIR_BENCH_TREE", str(ROOT)))   # another commit's airctld: see --before

from air.airctld import fairshare, scheduler  # noqa: E402
from harness import report  # noqa: E402
from air.protos.config import PartitionConfig, QosConfig, SchedulerConfig  # noqa: E402
from air.airctld.fairshare import Assoc  # noqa: E402
from air.airctld.model import Job, NodeAlloc  # noqa: E402
from air.airctld.priority import PriorityModel, association  # noqa: E402
from air.airctld.simulate import TraceJob, make_nodes, simulate  # noqa: E402
from air.protos import air_pb2 as pb  # noqa: E402
from air.protos.states import JobPhase  # noqa: E402

SIZES = [1, 1, 1, 1, 2, 2, 4, 8, 16, 32, 64]          # nodes a job asks for
GPUS = [1, 2, 4, 8, 8, 8]                             # GPUs per node, for one-node jobs
ACCOUNTS = [Assoc(f"acct{i:02d}", shares=1 + i % 4) for i in range(20)]
USERS = [(f"acct{i % 20:02d}", f"user{i:03d}") for i in range(200)]


def _request(rng, n_nodes: int) -> tuple[int, int]:
    nodes = rng.choice(SIZES)
    gpus = rng.choice(GPUS) if nodes == 1 else 8
    return min(nodes, n_nodes), gpus


def _snapshot(n_nodes: int, n_pending: int, seed: int = 1):
    rng = random.Random(seed)
    nodes = make_nodes(n_nodes)
    switches = {n.name: f"leaf{i // 32:03d}" for i, n in enumerate(nodes)}
    active = []
    job_id = 10_000_000
    # 90% of the GPUs busy: whole-node jobs on most nodes, partial ones on some
    for i, node in enumerate(nodes):
        r = rng.random()
        if r < 0.8:
            taken = 8
        elif r < 0.95:
            taken = rng.choice([2, 4, 6])
        else:
            continue
        account, user = rng.choice(USERS)
        limit = rng.choice([3600, 4 * 3600, 12 * 3600, 24 * 3600])
        active.append(Job(job_id=job_id, uid=1, gid=1, user=user, name="r", partition="p", num_nodes=1,
                          gpus_per_node=taken, cpus_per_node=1, time_limit_s=limit, submit_time=0.0,
                          request=pb.JobRequest(account=account), phase=JobPhase.RUNNING,
                          start_time=-rng.random() * limit, allocation=(NodeAlloc(node.name, tuple(range(taken)), 1),)))
        job_id += 1
    pending = []
    for k in range(1, n_pending + 1):
        account, user = rng.choice(USERS)
        nodes_wanted, gpus = _request(rng, n_nodes)
        pending.append(Job(job_id=k, uid=1, gid=1, user=user, name="p", partition="p", num_nodes=nodes_wanted,
                           gpus_per_node=gpus, cpus_per_node=1, time_limit_s=rng.choice([1800, 3600, 4 * 3600, 86400]),
                           submit_time=-rng.random() * 86400, request=pb.JobRequest(account=account)))
    usage = {leaf: rng.random() * 1e7 for leaf in USERS}
    return nodes, switches, active, pending, usage


MAX_PASS_S = None   # --max-pass-s: the placement's time budget, when not the configuration's default


def one_pass(nodes, switches, active, pending, usage, now: float = 0.0, kept=None) -> tuple[float, scheduler.Plan]:
    """One pass as the controller makes it: everything from scratch, or with what the controller's
    planner keeps from pass to pass (`kept`: from keep()), its priority cache and GPU memo."""
    sched = SchedulerConfig()
    partitions = {"p": PartitionConfig("p", tuple(n.name for n in nodes), default=True)}
    qos = {"normal": QosConfig("normal")}
    capacity = (len(nodes) * 8, len(nodes) * 64)
    began = time.perf_counter()
    if kept is None:
        tree = fairshare.complete_tree(ACCOUNTS, {association(j) for j in pending} | set(usage))
        shares = fairshare.compute(tree, usage)
        model = PriorityModel(sched, partitions, qos, {k: s.fairshare for k, s in shares.items() if k[1]}, *capacity)
        priority = model.priorities(pending, now)
    else:
        from air.airctld.priority_cache import LEAF
        cache = kept.priorities
        rows = cache.rows(pending, PriorityModel(sched, partitions, qos, {}, *capacity))
        tree = fairshare.complete_tree(ACCOUNTS, {r[LEAF] for r in rows} | set(usage))
        shares = fairshare.compute(tree, usage)
        priority = cache.priorities(rows, {k: s.fairshare for k, s in shares.items() if k[1]}, now)
        pending = cache.order(pending)
    in_order = {"in_order": True} if kept is not None else {}
    free = scheduler.free_resources(nodes, active, switches, *(() if kept is None else (kept.gpu_memo,)))
    budget = dict(max_pass_s=sched.max_pass_s if MAX_PASS_S is None else MAX_PASS_S, timer=time.perf_counter) \
        if "max_pass_s" in inspect.signature(scheduler.schedule).parameters else {}   # older: no budget
    plan = scheduler.schedule(pending, free, partitions, now=now, active=active, priority=priority,
                              limits=scheduler.Limits(qos=qos), reservations=sched.reservations, **budget,
                              **in_order)
    return time.perf_counter() - began, plan


def keep():
    """What the controller's planner keeps from pass to pass, new."""
    from air.airctld.priority_cache import PriorityCache
    return types.SimpleNamespace(priorities=PriorityCache(), gpu_memo={})


def measure(n_nodes: int, n_pending: int, cached: bool) -> list[tuple[float, int, int]]:
    """(best pass, started, reserved), all at the same time (10 s): from scratch, or, with what the
    planner keeps, its first pass and a pass with what it kept from one at 0 s (each the best of
    three, each with what is kept new)."""
    snap = _snapshot(n_nodes, n_pending)
    if not cached:
        runs = [[one_pass(*snap, now=10.0) for _ in range(3)]]
    else:
        first = [one_pass(*snap, now=10.0, kept=keep()) for _ in range(3)]
        later = []
        for kept in [keep() for _ in range(3)]:
            one_pass(*snap, now=0.0, kept=kept)
            later.append(one_pass(*snap, now=10.0, kept=kept))
        runs = [first, later]
    out = []
    for results in runs:
        best, plan = min(results, key=lambda r: r[0])
        out.append((best, len(plan.starts), len(plan.reservations)))
    return out


def _tree(rev: str) -> Path:
    """Commit `rev`'s airctld and protos, from git, in a folder of their own."""
    tree = Path(tempfile.mkdtemp(prefix=f"air-{rev}-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "airctld", "protos"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def _before(tree: Path, n_nodes: int, n_pending: int) -> tuple[float, int, int]:
    """The from-scratch pass of the code in `tree` (see _tree), in a child process."""
    budget = [] if MAX_PASS_S is None else ["--max-pass-s", str(MAX_PASS_S)]
    out = subprocess.run([sys.executable, __file__, "--scratch-only", "--sizes", f"{n_nodes}x{n_pending}", *budget],
                         check=True, capture_output=True, text=True,
                         env={**os.environ, "AIR_BENCH_TREE": str(tree)}).stdout
    return tuple(json.loads(out.splitlines()[-1])[0])


def pass_table(sizes, before: str) -> list[str]:
    lines = [f"| nodes (8 GPUs) | pending jobs | pass, {before} | started | pass, this tree, first | started | "
             "pass, this tree, 10 s later | started | reserved | per pending job (later pass) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    tree = _tree(before)
    for n_nodes, n_pending in sizes:   # the two one after the other for each size: the host's speed drifts
        t0, s0, _ = _before(tree, n_nodes, n_pending)
        (t1, s1, _), (t2, s2, r2) = measure(n_nodes, n_pending, cached=True)
        line = (f"| {n_nodes:,} | {n_pending:,} | {t0 * 1000:.0f} ms | {s0} | {t1 * 1000:.0f} ms | {s1} | "
                f"{t2 * 1000:.0f} ms | {s2} | {r2} | {t2 / n_pending * 1e6:.1f} us |")
        print(line, flush=True)
        lines.append(line)
    return lines


def priority_table(n_nodes: int, pending_counts) -> list[str]:
    """Fairshare, priorities and the pass's order alone (what the placement budget does not bound):
    from scratch (PriorityModel.priorities and scheduler.pass_order, as every pass did before the
    cache), and with the cache: its first pass and a pass 10 s later. Best of five."""
    from air.airctld.priority_cache import LEAF
    sched = SchedulerConfig()
    lines = ["| pending jobs | from scratch | cache, first pass | cache, 10 s later |",
             "| ---: | ---: | ---: | ---: |"]
    for n_pending in pending_counts:
        nodes, _, _, pending, usage = _snapshot(n_nodes, n_pending)
        partitions = {"p": PartitionConfig("p", tuple(n.name for n in nodes), default=True)}
        qos = {"normal": QosConfig("normal")}
        capacity = (len(nodes) * 8, len(nodes) * 64)

        def scratch(now):
            began = time.perf_counter()
            tree = fairshare.complete_tree(ACCOUNTS, {association(j) for j in pending} | set(usage))
            shares = fairshare.compute(tree, usage)
            model = PriorityModel(sched, partitions, qos, {k: s.fairshare for k, s in shares.items() if k[1]},
                                  *capacity)
            scheduler.pass_order(pending, model.priorities(pending, now))
            return time.perf_counter() - began

        def cached(kept, now):
            began = time.perf_counter()
            rows = kept.priorities.rows(pending, PriorityModel(sched, partitions, qos, {}, *capacity))
            tree = fairshare.complete_tree(ACCOUNTS, {r[LEAF] for r in rows} | set(usage))
            shares = fairshare.compute(tree, usage)
            kept.priorities.priorities(rows, {k: s.fairshare for k, s in shares.items() if k[1]}, now)
            kept.priorities.order(pending)
            return time.perf_counter() - began
        t0 = min(scratch(10.0) for _ in range(5))
        t1 = min(cached(keep(), 10.0) for _ in range(5))
        later = []
        for _ in range(5):
            kept = keep()
            cached(kept, 0.0)
            later.append(cached(kept, 10.0))
        line = f"| {n_pending:,} | {t0 * 1000:.0f} ms | {t1 * 1000:.0f} ms | {min(later) * 1000:.0f} ms |"
        print(line, flush=True)
        lines.append(line)
    return lines


def _trace(n_nodes: int, day: float, seed: int = 2) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs = []
    t = 0.0
    job_id = 1
    offered = 0.0
    # offer about 1.3 times what the cluster can run in the day, arriving through the day
    while offered < 1.3 * n_nodes * 8 * day:
        nodes, gpus = _request(rng, n_nodes)
        runtime = rng.choice([600, 1800, 3600, 2 * 3600, 4 * 3600]) * rng.uniform(0.5, 1.0)
        limit = int(runtime * rng.uniform(1.1, 2.0))
        account, user = rng.choice(USERS)
        qos = "high" if rng.random() < 0.05 else "normal"
        jobs.append(TraceJob(job_id, t, user, account, nodes, gpus, runtime, limit, qos))
        offered += nodes * gpus * runtime
        job_id += 1
        t = min(day * 0.9, t + rng.expovariate(1 / 20.0))
    return jobs


QOS = (QosConfig("normal"), QosConfig("high", priority=10, preempt=("normal",)))
BEFORE = "79fc2a6"   # the last commit before backfill counted the jobs started earlier in a pass


def load_scheduler(rev: str):
    """The schedule function of airctld/scheduler.py as of commit `rev`."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:airctld/scheduler.py"], check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"scheduler_{rev}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module.schedule


def utilisation(n_nodes: int = 256, before: str = BEFORE) -> list[str]:
    day = 86400.0
    trace = _trace(n_nodes, day)
    lines = ["| scheduler | backfill | GPU utilisation over the day | jobs started | mean pass | first waiting "
             "job's delay from backfill, mean / worst | preemptions | most by one preemptor of one victim |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, impl in (("this one", None), (f"before ({before})", load_scheduler(before))):
        for backfill in (True, False):
            r = simulate(trace, make_nodes(n_nodes), until=day, assocs=ACCOUNTS, qos=QOS, pass_every=60.0,
                         backfill=backfill, measure_delay=backfill, schedule=impl)
            mean = sum(r.pass_seconds) / max(len(r.pass_seconds), 1)
            delays = r.top_delays or [0.0]
            delay = f"{sum(delays) / len(delays):.0f} s / {max(delays):.0f} s" if backfill else "-"
            line = (f"| {label} | {'on' if backfill else 'off'} | {r.utilisation * 100:.1f}% | {r.started:,} | "
                    f"{mean * 1000:.1f} ms | {delay} | {sum(r.preemptions.values())} | "
                    f"{max(r.preemptions.values(), default=0)} |")
            print(line, flush=True)
            lines.append(line)
    lines.insert(0, f"Simulated day on {n_nodes} nodes of 8 GPUs, {len(trace):,} jobs of 1 to 64 nodes offered "
                    f"(about 1.3 days of work, 5% in a QOS that preempts the others), a pass every 60 s:\n")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the smallest sizes only")
    parser.add_argument("--sizes", help="nodes x pending jobs, comma-separated: 10000x100000,1000x10000")
    parser.add_argument("--write", help="append the figures to this markdown file")
    parser.add_argument("--before", default=BEFORE, help="the commit whose scheduler to compare with")
    parser.add_argument("--max-pass-s", type=float, help="the placement's time budget (0: none, the whole queue)")
    parser.add_argument("--no-day", action="store_true", help="passes only, no simulated day")
    parser.add_argument("--scratch-only", action="store_true", help=argparse.SUPPRESS)   # see _before
    args = parser.parse_args()
    global MAX_PASS_S
    MAX_PASS_S = args.max_pass_s
    if args.sizes:
        sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    else:
        sizes = [(n, p) for n in ([1000] if args.quick else [1000, 4000, 10000])
                 for p in ([10000] if args.quick else [10000, 50000, 100000])]
    if args.scratch_only:
        print(json.dumps([measure(n, p, cached=False)[0] for n, p in sizes]))
        return
    lines = pass_table(sizes, args.before)
    lines += ["", f"Fairshare, priorities and the pass's order alone, {max(n for n, _ in sizes):,} nodes:", ""]
    lines += priority_table(max(n for n, _ in sizes), sorted({p for _, p in sizes}))
    if not args.no_day:
        lines += [""] + utilisation(64 if args.quick else 256, args.before)
    limit = SchedulerConfig().max_pass_s if MAX_PASS_S is None else MAX_PASS_S
    stop = (f"the placement stopping after `max_pass_s` = {limit:g} s (as Slurm's bf_max_time)" if limit else
            "the placement going through the whole queue (`max_pass_s` = 0)")
    report("scheduler", "\n".join(lines), args.write,
           "one full pass: fairshare, priority of every pending job, limits, placement, reservations (1,000, then "
           f"nothing passes an unreserved job) and backfill, {stop}; best of three. The code of {args.before} (from "
           "scratch every pass), then this tree's first pass (its priority cache empty, as after a start) and its "
           "pass 10 s later (the cache warm, as in a running controller), one size after the other. Slurm's default "
           "backfill examines 500 jobs per 30 s cycle")


if __name__ == "__main__":
    main()
