"""The store's retention against a reference written for clarity, not speed: after passes of any
budget (the work cut at any step, the controller restarted between passes), exactly what the rules
keep is left, and nothing else is touched."""
import math
import time
from collections import Counter

from hypothesis import HealthCheck, example, given, settings, strategies as st

from air.airctld import retention
from air.airctld.model import Job
from air.airctld.store import Store
from air.protos import air_pb2 as pb

DAY = 86400.0
LIMITS = retention.Limits(events_keep_s=3 * DAY, jobs_keep_s=10 * DAY, report_sample_s=60.0)
NOW = 40 * DAY


def _job(i: int) -> Job:
    return Job(job_id=0, uid=1000, gid=1000, user="u", name=f"j{i}", partition="p", num_nodes=1, gpus_per_node=1,
               cpus_per_node=1, time_limit_s=0, submit_time=0.0, request=pb.JobRequest(script="#!/bin/sh\n"))


def _around(*edges: float):
    """Any time, or one at (or a hair from) an edge a rule draws."""
    return st.one_of(st.floats(min_value=0.0, max_value=NOW),
                     st.sampled_from([e + d for e in edges for d in (-1.0, -1e-3, 0.0, 1e-3, 1.0)]))


EVENT_TIME = _around(NOW - LIMITS.events_keep_s)
job_spec = st.tuples(
    st.one_of(st.none(), _around(NOW - LIMITS.jobs_keep_s, NOW - retention.SETTLE_S)
              .filter(lambda t: 1.0 <= t < NOW)),                           # end time (None: still running)
    st.one_of(                                                              # report offsets before the end
        st.lists(st.one_of(st.floats(min_value=0.0, max_value=7200.0),
                           st.sampled_from([60.0 * k + d for k in range(1, 4) for d in (-1e-3, 0.0, 1e-3)])),
                 max_size=150),
        st.lists(st.floats(min_value=7000.0, max_value=7200.0), min_size=70, max_size=150)),   # dense: many a minute
    st.lists(st.tuples(EVENT_TIME, st.booleans()), max_size=4),            # events (t, cancel)
)


def _fill(path, jobs, node_events):
    store = Store(str(path))
    with store.transaction():
        ids, all_events = [], []
        for i, (end, reports, events) in enumerate(jobs):
            job_id = store.insert_job(_job(i), 0)
            ids.append(job_id)
            store.db.execute("DELETE FROM events WHERE job_id = ?", [job_id])   # the test's own events below
            if end is not None:
                store.db.execute("UPDATE jobs SET phase = 4, end_time = ? WHERE id = ?", [end, job_id])
            base = (end if end is not None else NOW) - 7200.0
            for offset in sorted(reports):
                store.db.execute("INSERT INTO reports (job_id, time, report) VALUES (?, ?, ?)",
                                 [job_id, base + offset, f"{offset}"])
            all_events += [(t, job_id, cancel) for t, cancel in events]
            store.db.execute("INSERT INTO steps (job_id, step_id, run, created, nodes, ntasks, command) "
                             "VALUES (?, 0, 0, 0, 'n1', 1, 'x')", [job_id])
        for t, job_id, cancel in sorted(all_events):   # written as they happen: in time order
            store.db.execute("INSERT INTO events (job_id, time, old_state, new_state, reason, detail, who) "
                             "VALUES (?, ?, 'RUNNING', ?, ?, '', 0)",
                             [job_id, t, "CANCELLED" if cancel else "COMPLETED", "CANCELLED" if cancel else "NONE"])
        for t in sorted(node_events):
            store.db.execute("INSERT INTO node_events (node, time, gpu, signal, message, critical) "
                             "VALUES ('n1', ?, -1, 'XID 79', '', 1)", [t])
    return store, ids


def _expected(store, jobs, ids, node_events, sample=60.0):
    """What the rules keep, worked out from the inputs alone."""
    kept_jobs, reports, events = set(), Counter(), set()   # (reports: rows, several may share a time)
    for job_id, (end, offsets, evs) in zip(ids, jobs):
        if end is not None and end < NOW - LIMITS.jobs_keep_s:
            continue
        kept_jobs.add(job_id)
        base = (end if end is not None else NOW) - 7200.0
        times = [base + o for o in sorted(offsets)]
        rows = list(enumerate(times))   # (order, time): the order they were written in
        if end is not None and end < NOW - retention.SETTLE_S and rows:
            keep = {rows[0][0], rows[-1][0]}
            seen = set()
            for n, t in rows:
                minute = math.floor(t / sample)
                if minute not in seen:
                    seen.add(minute)
                    keep.add(n)
            rows = [r for r in rows if r[0] in keep]
        reports.update((job_id, t) for _, t in rows)
        for t, cancel in evs:
            if cancel or t >= NOW - LIMITS.events_keep_s:
                events.add((job_id, t))
    nodes = sorted(t for t in node_events if t >= NOW - LIMITS.events_keep_s)
    return kept_jobs, reports, events, nodes


def _actual(store):
    db = store.db
    return ({r for (r,) in db.execute("SELECT id FROM jobs")},
            Counter((j, t) for j, t in db.execute("SELECT job_id, time FROM reports")),
            {(j, t) for j, t in db.execute("SELECT job_id, time FROM events")},
            sorted(t for (t,) in db.execute("SELECT time FROM node_events")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(job_spec, max_size=25), node_events=st.lists(EVENT_TIME, max_size=30),
       budget=st.sampled_from([0.0, 0.001, 10.0]), restart=st.booleans(), sample=st.sampled_from([60.0, 45.0, 7.0, 5000.0]))
# more than a step's reports in one minute, begun mid-minute: the step ended at start + one sample,
# and the next minute's reports were thinned in two steps (two of them kept)
@example(jobs=[(2746482.0, [7000.0] * 64 + [7038.0, 7060.0, 7061.0], [])], node_events=[], budget=0.0,
         restart=False, sample=60.0)
def test_passes_leave_exactly_what_the_rules_keep(tmp_path_factory, jobs, node_events, budget, restart, sample):
    path = tmp_path_factory.mktemp("ret") / "air.db"
    store, ids = _fill(path, jobs, node_events)
    expected = _expected(store, jobs, ids, node_events, sample)
    limits = retention.Limits(LIMITS.events_keep_s, LIMITS.jobs_keep_s, sample)
    for _ in range(10_000):   # passes of this budget until one finds nothing left
        done = retention.run_pass(store, limits, NOW, budget_s=budget)
        if restart:   # the cursors are in the store: a restarted controller goes on where it was
            store.close()
            store = Store(str(path))
        if not done.more:
            break
    assert not done.more
    kept_jobs, reports, events, nodes = _actual(store)
    assert kept_jobs == expected[0]
    assert reports == expected[1]
    assert events == expected[2]
    assert nodes == expected[3]
    steps = {j for (j,) in store.db.execute("SELECT job_id FROM steps")}
    assert steps == kept_jobs
    # and a later pass with nothing new to do changes nothing
    again = retention.run_pass(store, limits, NOW, budget_s=10.0)
    assert again.rows == 0 and _actual(store) == (kept_jobs, reports, events, nodes)
    store.close()


def test_a_job_that_ends_later_is_thinned_by_a_later_pass(tmp_path):
    store, ids = _fill(tmp_path / "air.db", [(None, [float(i) for i in range(0, 7200, 2)], [])], [])
    assert retention.run_pass(store, LIMITS, NOW).reports == 0   # running: every report stays
    with store.transaction():
        store.db.execute("UPDATE jobs SET phase = 4, end_time = ? WHERE id = ?", [NOW, ids[0]])
    assert retention.run_pass(store, LIMITS, NOW + 30).reports == 0   # not settled yet
    done = retention.run_pass(store, LIMITS, NOW + 120)
    left = store.db.execute("SELECT count(*) FROM reports").fetchone()[0]
    assert left in (120, 121, 122) and done.reports == 3600 - left   # two hours, one a minute, and the last


def test_the_maintenance_thread_runs_passes_and_reports_them(tmp_path):
    store, ids = _fill(tmp_path / "air.db", [(1.0, [1.0, 2.0], [(1.0, False)])], [1.0, 2.0])
    passes = []
    keeper = retention.Maintenance(store, LIMITS, clock=lambda: NOW, interval_s=0.05, on_pass=passes.append)
    keeper.start()
    try:
        deadline = time.monotonic() + 10
        while not any(p.jobs for p in passes):
            assert time.monotonic() < deadline, passes
            time.sleep(0.02)
    finally:
        keeper.stop()
    assert store.db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    assert sum(p.node_events for p in passes) == 2


def test_a_node_event_without_a_time_is_taken_as_old_and_never_stops_the_passes(tmp_path):
    """An earlier version stored a NaN event time, which SQLite keeps as NULL: a pass compared it and
    failed, and every later one with it, the jobs' purge included."""
    store, ids = _fill(tmp_path / "air.db", [(1.0, [], [])], [1.0])
    with store.transaction():
        for t in (None, NOW - 1.0):
            store.db.execute("INSERT INTO node_events (node, time, gpu, signal, message, critical) "
                             "VALUES ('n1', ?, 0, 'XID 13', '', 0)", [t])
    for _ in range(3):
        retention.run_pass(store, LIMITS, NOW)
    assert [t for (t,) in store.db.execute("SELECT time FROM node_events")] == [NOW - 1.0]
    assert store.db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
