"""What the chaos benchmark measured, worked out from what it recorded. Pure: no I/O, no clock.

Inputs, all in seconds of the same wall clock (the controller stamps its events with it):
- steps: run -> [(time the step's line appeared in rank 0's log, step)], in order; each run of the
  job logs to a file of its own, so a step's run is known;
- restored: run -> (time rank 0 said it resumed, the step it resumed from);
- ranks: run -> when the last node daemon started its ranks (from the daemons' logs);
- events: the job's state changes from the controller's store, (time, old state, new state, reason, detail);
- faults: what was injected, when, and the job's run at that moment.

Definitions:
- A step counts when no later run trains it again: its result is the one in the final state.
- A step's time is from the previous line of the same run (for a run's first step, from the line
  saying it resumed). ETTR = the time of the steps that count / wall time from the job's first start
  to its end.
- A fault's resume time: from the fault to the first step logged by the run that carries on (the
  next run when the fault requeued the job, else the same run). Its cost: the time from the
  interrupted run's last step before the fault to the start of the step that carries on, less the
  steps that count in between, plus the time the interrupted run spent before the fault on steps
  that do not count (work lost since its last checkpoint, trained again by the next run). A run
  that carries on through a fault costs nothing: a slower step still counts as a step.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Fault:
    kind: str
    time: float
    node: str = ""          # "" for the controller
    run: int = 0            # the job's run when it was injected
    batch_host: bool = False
    undone: float = 0.0     # when it was undone: SIGCONT, link up, daemon back, node resumed
    note: str = ""


@dataclass
class FaultOutcome:
    fault: Fault
    requeued: bool = False
    reason: str = ""        # why the run ended, as the controller recorded it
    detect: float | None = None    # fault -> the run left RUNNING
    wait: float | None = None      # -> the next run started (scheduling, waiting for the old run's fence)
    launch: float | None = None    # -> every node started its ranks (batch script, airrun, step set up)
    restart: float | None = None   # -> rank 0 restored (Python + torch start, process group, restore)
    first: float | None = None     # -> the first step
    resume: float | None = None    # fault -> the first step of the run that carries on
    redone: int = 0                # steps trained again
    work_lost: float = 0.0         # the time the interrupted run spent on them
    cost: float | None = None      # resume time not spent on steps that count, plus work_lost


@dataclass
class Analysis:
    total_steps: int
    start: float
    end: float
    useful: float
    ettr: float
    runs: int
    missing: list[int]
    startup: float
    tail: float
    outcomes: list[FaultOutcome] = field(default_factory=list)

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def other(self) -> float:
        """Lost time no fault, start or end accounts for (checkpoint stalls are inside steps' times)."""
        return self.wall - self.useful - self.startup - self.tail - sum(o.cost or 0.0 for o in self.outcomes)


def run_spans(events: list[tuple]) -> tuple[list[float], dict[int, tuple]]:
    """The start of each run (the n-th entry into RUNNING is run n) and how each ended: (time, state,
    reason, detail)."""
    starts, ends = [], {}
    for time_, old, new, reason, detail in events:
        if new == "RUNNING" and old != "RUNNING":
            starts.append(time_)
        elif old == "RUNNING" and new != "RUNNING":
            ends[len(starts) - 1] = (time_, new, reason, detail)
    return starts, ends


def analyse(steps: dict[int, list[tuple[float, int]]], restored: dict[int, tuple[float, int]],
            events: list[tuple], faults: list[Fault], total_steps: int,
            ranks: dict[int, float] | None = None) -> Analysis:
    starts, ends = run_spans(events)
    counted: dict[int, int] = {}
    for run in sorted(steps):
        for _, step in steps[run]:
            counted[step] = run               # a later run's step replaces an earlier one's
    durations: dict[tuple[int, int], tuple[float, float]] = {}   # (run, step) -> (end time, duration)
    every = [b[0] - a[0] for run in steps for a, b in zip(steps[run], steps[run][1:])]
    typical = statistics.median(every) if every else 0.0
    for run, lines in steps.items():
        for i, (t, step) in enumerate(lines):
            if i:
                began = lines[i - 1][0]
            elif run in restored and restored[run][0] <= t:
                began = restored[run][0]
            else:
                began = t - typical
            durations[(run, step)] = (t, t - began)
    useful = sum(d for (run, step), (_, d) in durations.items() if counted.get(step) == run)
    start = starts[0] if starts else min((lines[0][0] for lines in steps.values() if lines), default=0.0)
    last_step = max((lines[-1][0] for lines in steps.values() if lines), default=start)
    final = ends.get(len(starts) - 1)
    end = final[0] if final and final[1] not in ("PENDING", "COMPLETING") else last_step
    first_step = min((t - d for t, d in durations.values()), default=start)
    analysis = Analysis(total_steps=total_steps, start=start, end=end, useful=useful,
                        ettr=useful / (end - start) if end > start else 0.0, runs=len(starts),
                        missing=[s for s in range(1, total_steps + 1) if s not in counted],
                        startup=max(0.0, first_step - start), tail=max(0.0, end - last_step))
    for i, fault in enumerate(faults):
        after = faults[i + 1].time if i + 1 < len(faults) else float("inf")
        analysis.outcomes.append(_outcome(fault, after, steps, restored, ranks or {}, starts, ends, counted,
                                          durations))
    return analysis


def _outcome(fault, after, steps, restored, ranks, starts, ends, counted, durations) -> FaultOutcome:
    out = FaultOutcome(fault)
    later = sorted(r for r in steps if r > fault.run and steps[r] and steps[r][0][0] >= fault.time)
    if later and steps[later[0]][0][0] < after:
        run = later[0]
        out.requeued = True
        first = steps[run][0]
        end = ends.get(fault.run)
        if end:
            out.reason = ": ".join(x for x in (end[2] if end[2] != "NONE" else "", end[3]) if x)
            out.detect = end[0] - fault.time
        if run < len(starts):
            out.wait = starts[run] - (end[0] if end else fault.time)
            began = starts[run]
            if run in ranks and ranks[run] >= began:
                out.launch = ranks[run] - began
                began = ranks[run]
            if run in restored:
                out.restart = restored[run][0] - began
                out.first = first[0] - restored[run][0]
        out.redone = sum(1 for (r, step) in durations if r == fault.run and counted[step] != r)
    else:
        run = fault.run
        first = next(((t, step) for t, step in steps.get(run, []) if t > fault.time), None)
        if first is None or first[0] >= after:
            return out                       # the job never trained again before the next fault
    out.resume = first[0] - fault.time
    # lost: from the interrupted run's last line before the fault to the start of the step that
    # carries on, less the steps that count in between; and before that, the interrupted run's steps
    # that do not count (trained again; a run that carried on leaves them to the fault that ends it)
    a = max((t for t, _ in steps.get(fault.run, []) if t <= fault.time), default=fault.time)
    b = first[0] - durations[(run, first[1])][1]
    if out.requeued:
        out.work_lost = sum(d for (r, step), (t, d) in durations.items()
                            if r == fault.run and counted[step] != r and t <= a)
    inside = sum(max(0.0, min(t, b) - max(t - d, a)) for (r, step), (t, d) in durations.items() if counted[step] == r)
    out.cost = max(0.0, b - a) - inside + out.work_lost
    return out


def late_steps(steps: dict[int, list[tuple[float, int]]]) -> list[tuple[int, int, int]]:
    """(older run, its step, newer run) for each step an older run logged after a newer run's first step:
    two runs training at once, seen in the logs rather than in the process table."""
    late = []
    for old in steps:
        for new in steps:
            if new > old and steps[new]:
                late += [(old, step, new) for t, step in steps[old] if t > steps[new][0][0]]
    return sorted(late)


def batch_mismatches(history: dict[int, str], reference: dict[int, str]) -> list[int]:
    """Steps whose counted batch differs from the uninterrupted run's (or that one run lacks)."""
    return sorted(s for s in set(history) | set(reference) if history.get(s) != reference.get(s))


# ------------------------------------------------------------------ tables

KINDS = {
    "stop": "airnoded SIGSTOP past the node timeout",
    "kill": "a host crash: airnoded, the job's processes there and their shepherds kill -9; daemon started again",
    "ctld": "airctld kill -9, started again",
    "restart": "airnoded SIGTERM, started again",
    "crash": "airnoded kill -9 alone (its jobs' processes live on), started again",
    "cut": "the host's link down past the node timeout",
    "xid": "XID 79 on a GPU of the job; node resumed after",
    "preempt": "a high-QOS job that needs the training job's nodes",
}


def _mean(values) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.fmean(values):.1f}" if values else "-"


def per_kind_table(analysis: Analysis) -> str:
    rows = ["| fault | n | requeued | detect (s) | to next start (s) | launch (s) | restart + restore (s) "
            "| first step (s) | fault -> first step (s) | steps redone | work lost (s) | cost per fault (s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in KINDS:
        group = [o for o in analysis.outcomes if o.fault.kind == kind]
        if not group:
            continue
        rows.append(f"| {kind}: {KINDS[kind]} | {len(group)} | {sum(o.requeued for o in group)} "
                    f"| {_mean(o.detect for o in group)} | {_mean(o.wait for o in group)} "
                    f"| {_mean(o.launch for o in group)} "
                    f"| {_mean(o.restart for o in group)} | {_mean(o.first for o in group)} "
                    f"| {_mean(o.resume for o in group)} | {_mean(o.redone for o in group)} "
                    f"| {_mean(o.work_lost for o in group)} | {_mean(o.cost for o in group)} |")
    if analysis.outcomes:
        every = analysis.outcomes
        rows.append(f"| all, in total | {len(every)} | {sum(o.requeued for o in every)} | "
                    + " | ".join(f"{sum(getattr(o, k) or 0 for o in every):.1f}"
                                 for k in ("detect", "wait", "launch", "restart", "first", "resume"))
                    + f" | {sum(o.redone for o in every)} | {sum(o.work_lost for o in every):.1f} "
                    f"| {sum(o.cost or 0 for o in every):.1f} |")
    return "\n".join(rows)


def timeline_table(analysis: Analysis) -> str:
    def s(v):
        return "-" if v is None else f"{v:.1f}"
    rows = ["| # | at (s) | fault | node | run | outcome | detect | to start | launch | restart | first step "
            "| resume | redone | cost |", "|---:|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, o in enumerate(analysis.outcomes, 1):
        f = o.fault
        node = f.node + (" (batch host)" if f.batch_host else "") if f.node else "-"
        outcome = f"requeued ({o.reason})" if o.requeued else ("carried on" if o.resume is not None else "no step after")
        rows.append(f"| {i} | {f.time - analysis.start:.0f} | {f.kind} | {node} | {f.run} | {outcome} | {s(o.detect)} "
                    f"| {s(o.wait)} | {s(o.launch)} | {s(o.restart)} | {s(o.first)} | {s(o.resume)} | {o.redone} | {s(o.cost)} |")
    return "\n".join(rows)
