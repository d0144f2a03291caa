"""Job history at scale: airacct over a store of 1,000,000 finished jobs.

    python bench/bench_history.py [--jobs 1000000] [--write bench/RESULTS.md]

A local cluster (`aircontrol local up`, 1 node) is brought up, its controller stopped, and its
store filled with finished jobs: 50 users in 10 accounts over the last 365 days (about 2,700 jobs
a user in the last week at a million), 5% of them requeued once (a run row each), 20% with two
steps. The controller is started again on that store, and the figures are the wall time of the
real command, client start included, median of 5:
- `airacct -u USER -S now-7days` (the issue's target: under 1 s), the default sacct format;
- the same with `-X -P -n -o JobID,State,Elapsed` (the reply and the decoding only);
- `airacct -j ID` (one job, any age);
- `airacct -A ACCOUNT -S now-1days -X`;
and the controller's side alone (Store.history in process, the same store) for the first query.

No Slurm figure: the Slurm of ../shared/peers/slurm runs without slurmdbd, so its sacct has no
history to read.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent

from air.airctld.store import Store, _JOB_COLUMNS  # noqa: E402
from harness import LocalAir, report, table  # noqa: E402
from air.protos import air_pb2 as pb  # noqa: E402

USERS = 50
ACCOUNTS = 10
DAYS = 365


def _cli(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, AIR_CONF=str(cfg), PATH=f"{BIN}:{os.environ['PATH']}")
    proc = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _timed(cfg: Path, *args: str, runs: int = 5) -> tuple[float, int]:
    times, lines = [], 0
    for _ in range(runs):
        began = time.perf_counter()
        out = _cli(cfg, *args)
        times.append(time.perf_counter() - began)
        lines = len(out.stdout.splitlines())
    return statistics.median(times), lines


def fill(path: str, total: int, now: float) -> None:
    """`total` finished jobs written straight into the store's tables, as the controller writes them."""
    rng = random.Random(1)
    store = Store(path)
    requests = {}
    for u in range(USERS):
        account = f"acct{u % ACCOUNTS}"
        requests[u] = pb.JobRequest(name="train", script="#!/bin/bash\nairrun python train.py\n", nodes=2,
                                    gpus_per_node=8, ntasks_per_node=8, cpus_per_task=4, account=account,
                                    qos="normal", workdir=f"/home/user{u:02d}/run",
                                    submit_line="airbatch -N2 --gpus-per-node=8 train.sh").SerializeToString()
    cols = list(_JOB_COLUMNS) + ["account", "qos"]
    insert = f"INSERT INTO jobs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    batch, runs, steps = [], [], []
    alloc = json.dumps([["node01", list(range(8)), 32], ["node02", list(range(8)), 32]])
    job_id = 0
    conn = store.db.conn
    conn.execute("BEGIN")
    for i in range(total):
        job_id += 1
        u = rng.randrange(USERS)
        submit = now - DAYS * 86400 * (1 - i / total) + rng.uniform(0, 30)
        start = submit + rng.uniform(1, 600)
        end = start + rng.uniform(60, 7200)
        requeued = rng.random() < 0.05
        row = {"uid": 10000 + u, "gid": 10000 + u, "user": f"user{u:02d}", "name": "train", "partition": "gpu",
               "num_nodes": 2, "gpus_per_node": 8, "cpus_per_node": 32, "time_limit_s": 14400,
               "submit_time": submit, "priority": 1000, "phase": 4, "result": 1 if rng.random() < 0.9 else 2,
               "reason": 0, "reason_detail": "", "hold": 0, "allocation": alloc, "start_time": start,
               "end_time": end, "exit_code": 0, "exit_signal": 0, "restart_count": int(requeued),
               "last_stop_reason": 15 if requeued else 0, "array_job_id": 0, "array_task_id": 0,
               "figures": "", "request": requests[u], "account": f"acct{u % ACCOUNTS}", "qos": "normal"}
        batch.append([row[c] for c in cols])
        if requeued:
            runs.append((job_id, 0, start - 300, start - 10, alloc, 15, "preempted", 0, 15))
        if rng.random() < 0.2:
            steps += [(job_id, 0, int(requeued), start + 5, "node[01-02]", 16, "python train.py"),
                      (job_id, 1, int(requeued), start + 50, "node01", 1, "hostname")]
        if len(batch) == 50_000:
            conn.executemany(insert, batch)
            batch = []
    conn.executemany(insert, batch)
    conn.executemany("INSERT INTO runs (job_id, run, start_time, end_time, allocation, reason, detail, "
                     "exit_code, exit_signal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", runs)
    conn.executemany("INSERT INTO steps (job_id, step_id, run, created, nodes, ntasks, command) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)", steps)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    store.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--write", help="append the figures to this markdown file")
    args = ap.parse_args()
    air = LocalAir(nodes=1, prefix="air-bench-history-").up()
    d, cfg = air.dir, Path(air.config)
    try:
        pids = [int(p) for p in (d / "pids").read_text().split()]
        os.kill(pids[0], signal.SIGTERM)
        while Path(f"/proc/{pids[0]}").exists() and "zombie" not in Path(f"/proc/{pids[0]}/status").read_text():
            time.sleep(0.05)
        db = str(d / "state" / "air.db")
        now = time.time()
        began = time.perf_counter()
        fill(db, args.jobs, now)
        fill_s = time.perf_counter() - began
        log = open(d / "log" / "airctld.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "air.airctld", "--config", str(cfg)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        pids[0] = proc.pid
        (d / "pids").write_text("\n".join(map(str, pids)) + "\n")
        deadline = time.monotonic() + 120
        while subprocess.run([str(BIN / "airinfo")], env=dict(os.environ, AIR_CONF=str(cfg)),
                             capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "airctld did not start"
            time.sleep(0.2)
        user = "10007"   # a uid: these users exist only in the store
        week, week_lines = _timed(cfg, "airacct", "-u", user, "-S", "now-7days")
        lean, lean_lines = _timed(cfg, "airacct", "-u", user, "-S", "now-7days", "-X", "-P", "-n",
                                  "-o", "JobID,State,Elapsed")
        one, _ = _timed(cfg, "airacct", "-j", str(args.jobs // 3))
        acct, acct_lines = _timed(cfg, "airacct", "-A", "acct3", "-S", "now-1days", "-X", "-a")
        store = Store(db)
        req = pb.HistoryRequest(uids=[10007], since=time.time() - 7 * 86400)
        inner = []
        for _ in range(5):
            t0 = time.perf_counter()
            got, _more = store.history(req, 100_000)
            inner.append(time.perf_counter() - t0)
        store.close()
        rows = [
            ("`airacct -u USER -S now-7days` (s)", f"{week:.3f}", f"{week_lines} lines; target < 1 s"),
            ("same, `-X -P -n -o JobID,State,Elapsed` (s)", f"{lean:.3f}", f"{lean_lines} jobs"),
            ("`airacct -j ID` (s)", f"{one:.3f}", "one job, any age"),
            ("`airacct -A ACCOUNT -S now-1days -X -a` (s)", f"{acct:.3f}", f"{acct_lines} lines"),
            ("controller side of the first query, in process (s)", f"{statistics.median(inner):.3f}",
             f"{len(got)} jobs with runs and steps"),
            ("filling the store (s)", f"{fill_s:.1f}", f"{args.jobs:,} jobs"),
        ]
    finally:
        air.down()
    report("job history", table(["figure", "AIR", "note"], rows), args.write,
           f"{args.jobs:,} finished jobs of {USERS} users over {DAYS} days. No Slurm figure (the peer Slurm has no "
           "slurmdbd)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
