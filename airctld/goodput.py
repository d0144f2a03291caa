"""Goodput: where a job's time went. Pure: the job's runs and their figures in, a pb.Goodput out.

The controller knows when the job was submitted and when each run started and ended; each run's
runtime knows (runtime/goodput.py) when its first step ended, how long it trained, restored and
was blocked saving checkpoints, and how much work the run before it lost. For each run:

    start ── starting ── restoring ── first step ── training + checkpoint ── ... ── end
                                                     (other: what is left, e.g. stopping)

and between runs, down time. Lost work is time a run trained on steps that the next run computed
again; it is taken out of training. ETTR = training / wall time from first start to end.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from air.protos import air_pb2 as pb
from air.protos.reports import number

# the runtime's figures, and the largest value each may take (a job writes them: hostile input)
_FIELDS = {"run": 1e9, "first_step_time": 1e12, "train_s": 1e9, "ckpt_s": 1e9, "ckpt_pre_s": 1e9, "restore_s": 1e9,
           "restored_step": 1e15, "steps": 1e15, "lost_steps": 1e15, "lost_s": 1e9}


def figures_from_report(text: str) -> str:
    """The runtime's figures in a progress report (rank 0's JSON), checked and written again
    compactly; "" when there are none. Only known keys with finite, non-negative numbers in range."""
    if not text:
        return ""
    try:   # (integers read as floats: 10**400 is inf, not an int isfinite cannot take)
        raw = json.loads(text, parse_int=float)
    except (ValueError, RecursionError, OverflowError):
        return ""
    got = raw.get("goodput") if isinstance(raw, dict) else None
    if not isinstance(got, dict):
        return ""
    out = {}
    for key, limit in _FIELDS.items():
        value = number(got.get(key))
        if value is not None and 0 <= value <= limit:
            out[key] = value
    return json.dumps(out, separators=(",", ":")) if out else ""


@dataclass(frozen=True)
class Run:
    start: float
    end: float          # 0: still running
    figures: str        # figures_from_report's output, or ""


def _load(figures: str) -> dict:
    try:
        value = json.loads(figures) if figures else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def breakdown(submit_time: float, runs: list[Run], now: float) -> pb.Goodput:
    """Runs in order; the last one's end is the job's end, or 0 while it runs (then `now`)."""
    out = pb.Goodput(runs=len(runs))
    started = [r for r in runs if r.start > 0]
    if not started:
        out.queued_s = max(0.0, now - submit_time) if submit_time else 0.0
        return out
    out.queued_s = max(0.0, started[0].start - submit_time)
    end = started[-1].end or now
    out.wall_s = max(0.0, end - started[0].start)
    held = 0.0
    for i, run in enumerate(started):
        run_end = run.end or now
        length = max(0.0, run_end - run.start)
        held += length
        if i:
            out.down_s += max(0.0, run.start - (started[i - 1].end or run.start))
        f = _load(run.figures)
        if not f:
            out.partial = True
            continue
        first = f.get("first_step_time", 0.0)
        before_first = min(max(0.0, first - run.start), length) if first else length
        restore = f.get("restore_s", 0.0)
        early_ckpt = f.get("ckpt_pre_s", 0.0)     # saves before the first step: in their own category
        starting = max(0.0, before_first - restore - early_ckpt)
        parts = [starting, restore, f.get("train_s", 0.0), f.get("ckpt_s", 0.0)]
        if sum(parts) > length > 0:   # figures that claim more than the run had (a job writes them)
            parts = [p * length / sum(parts) for p in parts]
        elif length <= 0:
            parts = [0.0] * 4
        out.starting_s += parts[0]
        out.restoring_s += parts[1]
        out.training_s += parts[2]
        out.checkpoint_s += parts[3]
        out.lost_s += f.get("lost_s", 0.0)
        out.lost_steps += int(f.get("lost_steps", 0))
    out.lost_s = min(out.lost_s, out.training_s)
    out.training_s -= out.lost_s
    accounted = out.starting_s + out.restoring_s + out.training_s + out.checkpoint_s + out.lost_s
    out.other_s = max(0.0, held - accounted)
    out.ettr = min(1.0, out.training_s / out.wall_s) if out.wall_s > 0 else 0.0   # (sums of floats)
    return out


def run_ended(old, new) -> bool:
    """Whether a job change (old, new Job) ends a run: a requeue, or the job's end after it started."""
    return old.start_time > 0 and (new.restart_count > old.restart_count or
                                   (new.phase == pb.JOB_PHASE_DONE and old.phase != pb.JOB_PHASE_DONE))


def live_figures(report: str, run: int) -> str:
    """The figures of a running job's latest report, if they are its current run's."""
    figures = figures_from_report(report)
    return figures if figures and _load(figures).get("run") == run else ""


def job_goodput(job: pb.Job, runs, live_report: str, now: float) -> pb.Goodput:
    """For a job as views show it, its earlier runs (pb.HistoryRun) and, while it runs, its latest report."""
    parts = [Run(r.start_time, r.end_time, r.figures) for r in runs]
    if job.start_time:
        done = job.phase == pb.JOB_PHASE_DONE
        parts.append(Run(job.start_time, job.end_time if done else 0.0,
                         job.figures if done else live_figures(live_report, job.restart_count)))
    return breakdown(job.submit_time, parts, now)
