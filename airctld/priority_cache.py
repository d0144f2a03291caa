"""Multifactor priorities pass after pass, the same numbers as PriorityModel.priorities computed
from scratch, reworking only the jobs whose number may have changed. Pure: no I/O, no clock.

A job's priority is int(round(v)), with v = age term + fairshare term + size, partition and QOS
terms - nice (priority.py). Only two of them move between passes: the age term, monotone in time
(it grows at most w_age per second pending, and stops at max_age), and the fairshare term of the
job's (account, user) leaf, the same for all of that leaf's jobs. The rest is fixed when the job is
submitted (its request, submit time, user, partition and size never change afterwards) and is
kept per job, keyed by the job's request object.

So when a job's number is worked out (v_c at time t_c, fairshare term b_c), the cache also keeps
how far v may move before it could round to another integer. At a later pass (time t, term b) the
number stands as long as, in real arithmetic with a margin far above floating-point error,

    v_c + max(w_age, 0) * (t - t_c) + (b - b_c) < P + 0.5   and
    v_c - max(-w_age, 0) * (t - t_c) + (b - b_c) > P - 0.5

(float addition and rounding are monotone, so v stays in that interval as well). Each side is kept
as one number per job against one number per leaf and pass, so a pass costs a comparison per job
and the full sum only for the few jobs near a rounding step. Anything else (weights, partition or
QOS priorities, cluster size, the clock going back) starts the cache afresh.
"""
from __future__ import annotations

import math
from operator import itemgetter
from typing import Mapping, Sequence

from air.airctld.model import Job
from air.airctld.priority import PriorityModel, job_qos
from air.airctld.scheduler import pass_order

# a job's row: what never changes for it, its place in submit order, then its number and the
# bounds it holds within
REQUEST, LEAF, SUBMIT, SIZE, PART, QOS, NICE, JOB_ID, SEQ, PRIORITY, HIGH, LOW, KEY = range(13)
INF = float("inf")
REL = 1e-9       # margin, relative to the size of the sum's terms: float error is ~1e-15 of it
SPAN = 1 << 21   # order keys: seq - priority * SPAN, exact in a float while seq < SPAN and |priority| < 2**31


class PriorityCache:
    def __init__(self) -> None:
        self._basis: tuple | None = None    # what the fixed terms were made with
        self._rows: dict[int, list] = {}    # job_id -> row
        self._leaves: dict[tuple[str, str], tuple[str, str]] = {}
        self._origin: float | None = None   # times are kept relative to this (precision)
        self._now = -INF                    # the last pass's time
        self._scale = 1.0                   # the largest a term of the sum can be
        self._seq = 0                       # the next row's place in submit order
        self._last = (-INF, 0)              # (submit time, id) of the row with the last place
        self._new: list[list] = []          # rows made since places were last given
        self._top = 0                       # the largest |priority| given since the rows were made
        self._keys: list[float] = []        # the order keys of the last priorities()' rows

    def rows(self, jobs: Sequence[Job], model: PriorityModel) -> list[list]:
        """The jobs' rows, in order; made for new jobs (the model's fairshare is not used here)."""
        s = model.sched
        basis = (s, model.part_factor, model.qos_factor, model.total_gpus, model.total_cpus)
        if basis != self._basis:
            self._basis, self._rows, self._origin, self._seq, self._top = basis, {}, None, 0, 0
            self._leaves = {}
            self._last, self._new = (-INF, 0), []
            self._scale = 1.0 + abs(s.weight_age) + abs(s.weight_fairshare) + abs(s.weight_jobsize) + \
                abs(s.weight_partition) + abs(s.weight_qos)
        get, made = self._rows.get, self._maker(model)
        out = [r if (r := get(job.job_id)) is not None and r[REQUEST] is job.request else made(job) for job in jobs]
        if len(self._rows) > 2 * len(out) + 1000:   # jobs gone since: keep only those of this pass
            self._rows = {r[JOB_ID]: r for r in out}
        return out

    def _maker(self, model: PriorityModel):
        """A function that makes a job's row (what the model gives it that never changes, no place in
        submit order and no number yet), with what every row needs looked up once."""
        s = model.sched
        w_size, w_part, w_qos, default_qos = s.weight_jobsize, s.weight_partition, s.weight_qos, s.default_qos
        part_of, qos_of = model.part_factor.get, model.qos_factor.get
        gpus, cpus = model.total_gpus, model.total_cpus
        rows, new, leaves = self._rows, self._new, self._leaves

        def made(job: Job) -> list:
            req = job.request
            size = job.num_nodes * job.gpus_per_node / gpus if job.gpus_per_node else \
                job.num_nodes * job.cpus_per_node / cpus
            leaf = (job.account, job.user)
            row = rows[job.job_id] = [
                req, leaves.setdefault(leaf, leaf), job.submit_time,   # one tuple a leaf: less for gc
                w_size * (size if size < 1.0 else 1.0), w_part * part_of(job.partition, 0.0),
                w_qos * qos_of(job_qos(job, default_qos), 0.0), req.nice, job.job_id,
                -1, 0, -INF, INF, 0.0]   # no place and no number yet: bounds no pass can meet
            new.append(row)
            return row
        return made

    def priorities(self, rows: Sequence[list], fairshare: Mapping[tuple[str, str], float], now: float
                   ) -> dict[int, int]:
        """job_id -> priority for the rows (from rows(), this pass), given each leaf's fairshare factor
        (1.0 for a leaf without one), as PriorityModel(..., fairshare, ...).priorities gives."""
        s = self._basis[0]
        self._place()
        if self._origin is None or now < self._now:   # new, or the clock went back: ages may have shrunk
            self._origin = now
            for r in self._rows.values():
                r[HIGH], r[LOW] = -INF, INF
        self._now = now
        w_age, w_fs = s.weight_age / s.max_age_s, s.weight_fairshare
        up, down = max(w_age, 0.0), max(-w_age, 0.0)
        since = now - self._origin
        # the error of a pass's sums and of its keys: relative to the terms, and from times' rounding
        margin = REL * (self._scale + (up + down) * since) + (up + down) * 4 * math.ulp(abs(now) + abs(self._origin))

        class Leaves(dict):   # leaf -> (fairshare term, upper key, lower key), made when first asked
            def __missing__(self, leaf):
                b = w_fs * fairshare.get(leaf, 1.0)
                value = self[leaf] = (b, up * since + b + margin, b - down * since - margin)
                return value
        leaves = Leaves()
        cap = s.max_age_s
        span = float(SPAN)
        out = {}
        self._keys = keys = []
        key = keys.append
        for r in rows:
            b, high, low = leaves[r[LEAF]]
            if high < r[HIGH] and low > r[LOW]:
                out[r[JOB_ID]] = r[PRIORITY]
                key(r[KEY])
                continue
            waited = now - r[SUBMIT]
            waited = cap if waited > cap else (waited if waited > 0 else 0.0)
            # the sum exactly as PriorityModel.priorities writes it, term by term
            value = (w_age * waited + b + r[SIZE] + r[PART] + r[QOS] - r[NICE])
            p = out[r[JOB_ID]] = r[PRIORITY] = int(round(value))
            if abs(p) > self._top:
                self._top = abs(p)
            r[KEY] = r[SEQ] - p * span
            key(r[KEY])
            slack = margin + REL * abs(r[NICE])
            r[HIGH] = p + 0.5 - value - slack + b + up * since
            r[LOW] = p - 0.5 - value + slack + b - down * since
        return out

    def order(self, jobs: Sequence[Job]) -> list[Job]:
        """The jobs, whose rows came first in the last priorities() call, in the pass's order, as
        scheduler.pass_order gives it: priority, highest first, then submit time, then id. One float
        key a job, kept with its row (priority and place in submit order), sorts in a fraction of
        the time of a tuple made afresh for each."""
        keys = self._keys[:len(jobs)]
        if len(keys) < len(jobs) or self._seq >= SPAN or self._top >= 1 << 31:   # too many, or too large
            return pass_order(jobs, {j.job_id: self._rows[j.job_id][PRIORITY] for j in jobs})
        return list(map(jobs.__getitem__, sorted(range(len(keys)), key=keys.__getitem__)))

    def _place(self) -> None:
        """Give the rows made since the last time their places in submit order: after the others when
        they come after them (new jobs do: their ids and submit times grow), else all afresh."""
        new, self._new = self._new, []
        if not new:
            return
        key = itemgetter(SUBMIT, JOB_ID)
        after = len(new) < len(self._rows) and key(new[0]) > self._last and \
            all(key(a) < key(b) for a, b in zip(new, new[1:]))
        if not after or self._seq + len(new) >= SPAN:   # all afresh (the fewest places there can be)
            new = sorted(self._rows.values(), key=itemgetter(JOB_ID))
            new.sort(key=itemgetter(SUBMIT))   # stable: by submit time, then id
            self._seq = 0
            if not new:   # (rows made, then left out of the cache with their jobs)
                return
        span = float(SPAN)
        for k, r in enumerate(new, self._seq):
            r[SEQ] = k
            r[KEY] = k - r[PRIORITY] * span
        self._seq += len(new)
        self._last = key(new[-1])
