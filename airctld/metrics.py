"""The controller's Prometheus metrics.

Two kinds: what happens (submissions, starts, ends, requeues, preemptions, RPCs, passes, commits),
counted as it happens by `ControllerMetrics`; and what is (jobs by state, nodes, GPUs, fairshare,
training progress), read from the controller on each scrape by `StateCollector`, from snapshots
taken under the controller's lock. Names follow Prometheus's conventions: an `air_` prefix, base
units in the name, `_total` on counters. Label values come from the configuration (partitions,
accounts, QOS), from fixed sets (states, reasons, results, methods, codes), or name jobs and users;
user labels can be turned off (metrics_user_labels = false), since users are unbounded.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from air.airctld import goodput
from air.airctld.model import Job
from air.protos import air_pb2 as pb
from air.protos.reports import report_numbers
from air.protos.signals import kind_of
from air.protos.states import REASON_NAMES, JobPhase, Reason, long_state, node_state_name

_PENDING, _RUNNING, _COMPLETING, _DONE = JobPhase.PENDING, JobPhase.RUNNING, JobPhase.COMPLETING, JobPhase.DONE
_PREEMPTED = Reason.PREEMPTED
log = logging.getLogger("airctld")

if TYPE_CHECKING:
    from air.airctld.controller import Controller

# seconds, from a tenth of a second to a day: queue waits
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
COUNT_BUCKETS = (0, 1, 10, 100, 1000, 10_000, 100_000, 1_000_000)


class ControllerMetrics:
    """Counters and histograms, fed by the controller as things happen."""

    def __init__(self, user_labels: bool = True):
        self.registry = CollectorRegistry(auto_describe=True)
        self.user_labels = user_labels
        r = self.registry
        self.submissions = Counter("air_job_submissions", "Jobs accepted (each array task counts)",
                                   ["partition", "account"], registry=r)
        self.starts = Counter("air_job_starts", "Runs started (a requeued job's every run counts)",
                              ["partition"], registry=r)
        self.ends = Counter("air_job_ends", "Jobs ended, by how", ["partition", "result"], registry=r)
        self.requeues = Counter("air_job_requeues", "Runs that ended in a requeue, by why", ["reason"], registry=r)
        self.preemptions = Counter("air_job_preemptions", "Runs stopped to make room for a higher QOS",
                                   ["partition", "qos"], registry=r)
        self.queue_wait = Histogram("air_job_queue_wait_seconds",
                                    "Time each run waited: from submission, or from its requeue, to its start",
                                    ["partition"], buckets=WAIT_BUCKETS, registry=r)
        self.submit_to_start = Histogram("air_job_submit_to_start_seconds",
                                         "Time from a job's submission to its first start", ["partition"],
                                         buckets=WAIT_BUCKETS, registry=r)
        self.pass_seconds = Histogram("air_scheduler_pass_duration_seconds", "Time a scheduling pass plans for",
                                      buckets=FAST_BUCKETS, registry=r)
        self.pass_jobs = Histogram("air_scheduler_pass_jobs", "Pending jobs a scheduling pass looked at",
                                   buckets=COUNT_BUCKETS, registry=r)
        self.rpcs = Counter("air_rpc_requests", "RPCs answered, by method and status code", ["method", "code"],
                            registry=r)
        self.rpc_seconds = Histogram("air_rpc_duration_seconds", "Time to answer an RPC", ["method"],
                                     buckets=FAST_BUCKETS, registry=r)
        self.commit_seconds = Histogram("air_store_commit_duration_seconds",
                                        "Time a store transaction held the store, BEGIN to COMMIT",
                                        buckets=FAST_BUCKETS, registry=r)
        self.retention = Counter("air_store_retention_rows", "Rows the store's retention removed: reports "
                                 "thinned, old events, node events and jobs", ["kind"], registry=r)
        self.goodput = Counter("air_goodput_seconds", "Where jobs' time went, by account: queued, starting, "
                               "restoring, training, checkpoint, lost, down, other (added as each run starts "
                               "and ends)", ["account", "category"], registry=r)
        self._requeued_at: dict[int, float] = {}
        self._children: dict[tuple, object] = {}   # (metric, labels) -> its labelled child: _labels

    def _labels(self, metric, *values: str):
        """metric.labels(*values), kept: prometheus_client checks and converts the values and takes a lock
        at every call, a few times for each job's start and end (a tenth of the controller's Python time
        in a drain of trivial jobs). No labelled series is ever removed, so a kept child stays its."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def submitted(self, jobs: list[Job]) -> None:
        for job in jobs:
            self._labels(self.submissions, job.partition, job.account).inc()

    def changed(self, changes: list[tuple[Job, Job]], now: float) -> None:
        """Job changes the store has committed, (old, new) pairs. Counts are added once for each set of
        labels (a cancel of 100,000 jobs is one addition, not 100,000)."""
        counts: dict[tuple, int] = {}
        for old, new in changes:
            if new.phase == old.phase and new.restart_count == old.restart_count:
                continue   # (no start, requeue or end: nothing counted)
            mine: list[tuple] = []
            try:
                self._count(old, new, now, mine)
            except Exception:   # one change that cannot be counted costs only its own counts
                log.exception("job %d: metrics not updated", new.job_id)
                continue
            for key in mine:
                counts[key] = counts.get(key, 0) + 1
        for (metric, *labels), n in counts.items():
            self._labels(metric, *labels).inc(n)

    def _count(self, old: Job, new: Job, now: float, counts: list[tuple]) -> None:
        """One change's counts (the labels of each, added to `counts`), observations and goodput.
        (The phases are module constants: an enum's member read from its class costs 0.1 us.)"""
        phase, was = new.phase, old.phase
        if phase == _RUNNING and was == _PENDING:
            counts.append((self.starts, new.partition))
            self._started(new, new.account)
        if goodput.run_ended(old, new):
            end = new.end_time or now
            g = goodput.breakdown(old.start_time, [goodput.Run(old.start_time, end, new.figures)], end)
            account = new.account   # (read where it is needed: a cancel of pending jobs never needs it)
            for category in ("starting", "restoring", "training", "checkpoint", "lost", "other"):
                seconds = getattr(g, f"{category}_s")
                child = self._labels(self.goodput, account, category)   # (each series there from the first run,
                if seconds:                                              # at 0, for rate() and ratios)
                    child.inc(seconds)
        requeued = phase == _PENDING and (was == _RUNNING or was == _COMPLETING)
        if requeued:
            counts.append((self.requeues, Reason(new.last_stop_reason).name))
            self._requeued_at[new.job_id] = now
        ended = phase == _DONE and was != _DONE
        if (requeued or ended) and (new.last_stop_reason == _PREEMPTED or new.reason == _PREEMPTED):
            counts.append((self.preemptions, new.partition, new.request.qos or "default"))
        if ended:
            counts.append((self.ends, new.partition, long_state(phase, new.result)))
            self._requeued_at.pop(new.job_id, None)

    def _started(self, new: Job, account: str) -> None:
        requeued_at = self._requeued_at.pop(new.job_id, None)
        if new.restart_count == 0:   # the first start: queued since submission
            waited = max(0.0, new.start_time - new.submit_time)
            self._labels(self.submit_to_start, new.partition).observe(waited)
            self._labels(self.goodput, account, "queued").inc(waited)
        elif requeued_at is not None:   # a later one: down since the requeue
            waited = max(0.0, new.start_time - requeued_at)
            self._labels(self.goodput, account, "down").inc(waited)
        else:   # a requeue before a controller restart: when is not known
            waited = None
        if waited is not None:
            self._labels(self.queue_wait, new.partition).observe(waited)

    def retained(self, done) -> None:
        for kind in ("reports", "events", "node_events", "jobs"):
            if getattr(done, kind):
                self.retention.labels(kind).inc(getattr(done, kind))

    def scheduled(self, seconds: float, looked_at: int) -> None:
        self.pass_seconds.observe(seconds)
        self.pass_jobs.observe(looked_at)

    def rpc(self, method: str, code: str, seconds: float) -> None:
        self._labels(self.rpcs, method, code).inc()
        self._labels(self.rpc_seconds, method).observe(seconds)


class StateCollector:
    """What is, read from the controller at each scrape."""

    def __init__(self, controller: "Controller", user_labels: bool = True):
        self.c = controller
        # a cluster that keeps jobs private shows no job's or user's series to whoever reaches /metrics
        self.per_job = not controller.config.controller.private_jobs
        self.user_labels = user_labels and self.per_job

    def describe(self):
        return []   # (collected on scrape only, never at registration)

    def collect(self):
        c = self.c
        now = c.clock()
        with c._lock:
            pending = c.jobs.in_phase(JobPhase.PENDING)
            active = c.jobs.active()
            reports = {j.job_id: (c.latest_report.get(j.job_id), c.last_progress.get(j.job_id))
                       for j in active if j.phase == JobPhase.RUNNING}
        yield from self._jobs(pending, active)
        if self.per_job:
            yield from self._per_job(active, reports, now)
        yield from self._nodes(c.node_views())
        yield from self._fairshare(c.share_rows(pb.SharesRequest()))
        size = GaugeMetricFamily("air_store_size_bytes", "The store's files: the database and its write-ahead log",
                                 labels=["file"])
        for name, suffix in (("db", ""), ("wal", "-wal")):
            try:
                size.add_metric([name], os.path.getsize(c.store.path + suffix))
            except OSError:
                pass
        yield size

    def _jobs(self, pending: list[Job], active: list[Job]):
        by_state = GaugeMetricFamily("air_jobs", "Jobs not ended, by state, partition and account",
                                     labels=["state", "partition", "account"])
        counts: dict[tuple, int] = {}
        for j in pending + active:
            key = (long_state(j.phase, j.result), j.partition, j.account)
            counts[key] = counts.get(key, 0) + 1
        totals = {"PENDING": 0, "RUNNING": 0, "COMPLETING": 0}   # zeros too: a panel shows 0, not "no data"
        for key, n in sorted(counts.items()):
            by_state.add_metric(list(key), n)
            totals[key[0]] += n
        yield by_state
        states = GaugeMetricFamily("air_jobs_by_state", "Jobs not ended, by state", labels=["state"])
        for state, n in totals.items():
            states.add_metric([state], n)
        yield states
        reasons = GaugeMetricFamily("air_jobs_pending", "Pending jobs, by the reason they wait",
                                    labels=["reason", "partition"])
        counts = {}
        for j in pending:
            key = (REASON_NAMES.get(Reason(j.reason), Reason(j.reason).name), j.partition)
            counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            reasons.add_metric(list(key), n)
        yield reasons
        if self.user_labels:
            users = GaugeMetricFamily("air_user_jobs", "Jobs not ended, by user and state", labels=["user", "state"])
            counts = {}
            for j in pending + active:
                key = (j.user, long_state(j.phase, j.result))
                counts[key] = counts.get(key, 0) + 1
            for key, n in sorted(counts.items()):
                users.add_metric(list(key), n)
            yield users
            gpus = GaugeMetricFamily("air_user_gpus_allocated", "GPUs held by each user's running jobs",
                                     labels=["user"])
            held: dict[str, int] = {}
            for j in active:
                held[j.user] = held.get(j.user, 0) + sum(len(a.gpus) for a in j.allocation)
            for user, n in sorted(held.items()):
                gpus.add_metric([user], n)
            yield gpus

    def _per_job(self, active: list[Job], reports: dict, now: float):
        labels = ["job_id", "partition", "account"] + (["user"] if self.user_labels else [])
        families = {
            "step": GaugeMetricFamily("air_job_training_step", "The training step a running job last reported",
                                      labels=labels),
            "tokens_per_s": GaugeMetricFamily("air_job_tokens_per_second", "Tokens a second, all ranks together",
                                              labels=labels),
            "mfu": GaugeMetricFamily("air_job_mfu_ratio", "Model FLOPs utilisation (0 to 1)", labels=labels),
            "loss": GaugeMetricFamily("air_job_loss", "The loss a running job last reported", labels=labels),
            "since_checkpoint": GaugeMetricFamily("air_job_seconds_since_checkpoint",
                                                  "Seconds since the job's last checkpoint, from its reports",
                                                  labels=labels),
            "since_report": GaugeMetricFamily("air_job_seconds_since_progress",
                                              "Seconds since any rank of the job last reported", labels=labels),
        }
        gpus = GaugeMetricFamily("air_job_gpus", "GPUs a running job holds", labels=labels)
        for job in active:
            if job.phase != JobPhase.RUNNING:
                continue
            values = [str(job.job_id), job.partition, job.account] + \
                ([job.user] if self.user_labels else [])
            gpus.add_metric(values, sum(len(a.gpus) for a in job.allocation))
            text, heard = reports.get(job.job_id, (None, None))
            if heard is not None:
                families["since_report"].add_metric(values, max(0.0, now - heard))
            report = _report(text)
            for key in ("step", "tokens_per_s", "mfu", "loss"):
                if key in report:
                    families[key].add_metric(values, report[key])
            if report.get("checkpoint_time", 0) > 0 and "time" in report and heard is not None:
                # on the rank's clock up to its report, on ours since it arrived
                families["since_checkpoint"].add_metric(
                    values, max(0.0, report["time"] - report["checkpoint_time"]) + max(0.0, now - heard))
        yield gpus
        yield from families.values()

    def _nodes(self, views):
        nodes = GaugeMetricFamily("air_nodes", "Nodes, by sinfo's state (idle, mix, alloc, drain, drng, down, unk)",
                                  labels=["state"])
        counts = {s: 0 for s in ("idle", "mix", "alloc", "drain", "drng", "down", "unk")}
        part_gpus = GaugeMetricFamily("air_partition_gpus", "GPUs of each partition's nodes, by state "
                                      "(total, allocated, drained: on a node that is down or drained)",
                                      labels=["partition", "state"])
        per_part: dict[tuple[str, str], int] = {}
        partitions = self.c.config.partitions
        for p in partitions:
            for state in ("total", "allocated", "drained"):
                per_part[(p.name, state)] = 0
        for n in views:
            state = node_state_name(n)
            counts[state] += 1
            for p in n.partitions:
                per_part[(p, "total")] = per_part.get((p, "total"), 0) + len(n.gpus)
                per_part[(p, "allocated")] = per_part.get((p, "allocated"), 0) + n.gpus_alloc
                if state in ("drain", "drng", "down", "unk"):
                    per_part[(p, "drained")] = per_part.get((p, "drained"), 0) + len(n.gpus)
        for state, n in counts.items():
            nodes.add_metric([state], n)
        for key, n in sorted(per_part.items()):
            part_gpus.add_metric(list(key), n)
        yield nodes
        yield part_gpus
        drains = GaugeMetricFamily("air_node_drained", "1 for each node drained or down, by the health signal "
                                   "that did it (\"admin\": an admin; \"down\": not heard from)",
                                   labels=["node", "signal"])
        for n in views:
            state = node_state_name(n)
            if state in ("drain", "drng", "down"):
                kind = "down" if state == "down" else (kind_of(n.drain_signal).label if n.drain_signal else "admin")
                drains.add_metric([n.name, kind], 1)
        yield drains

    def _fairshare(self, rows):
        factor = GaugeMetricFamily("air_fairshare_factor", "Each account's fairshare factor (0 to 1)",
                                   labels=["account"])
        usage = GaugeMetricFamily("air_fairshare_usage_ratio", "Each account's share of the decayed usage "
                                  "(0 to 1, of its parent's)", labels=["account"])
        for r in rows:
            if not r.user:
                factor.add_metric([r.account], r.fairshare)
                usage.add_metric([r.account], r.norm_usage)
        yield factor
        yield usage


_REPORT_KEYS = ("step", "tokens_per_s", "mfu", "loss", "time", "checkpoint_time")


def _report(text: str | None) -> dict[str, float]:
    """The numbers a rank's report (JSON a job wrote: hostile input, already bounded in size) gives
    for metrics; what is missing, not a finite number, or not a number at all is left out."""
    numbers = report_numbers(text or "")
    return {k: float(numbers[k]) for k in _REPORT_KEYS if k in numbers}
