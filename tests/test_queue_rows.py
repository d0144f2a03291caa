"""Plain airq reads rows that airctld keeps rendered in squeue's default format. Checked against the
rows airq makes itself from the jobs (the -o path: ListJobs, compact_arrays, render), over a queue with
pending, held, running and ended jobs, array tasks of two arrays interleaved, and jobs that change
between listings: a kept row never outlives the version of the job it shows."""
import random

import pytest

from air.airctld import events
from air.airctld.model import NodeAlloc, evolve
from air.protos import air_pb2 as pb
from air.protos import squeue
from air.protos.credential import Identity
from air.protos.record import replace
from air.protos.states import JobPhase, JobResult, Reason

ALICE, BOB, ROOT = Identity(4242, 4242), Identity(4343, 4343), Identity(0, 0)


def _by_hand(c, clock, filt, who) -> str:
    """What airq -o '<the default format>' prints, without its header."""
    plain = pb.JobFilter()
    plain.CopyFrom(filt)
    plain.rendered = False
    jobs = [pb.Job.FromString(b) for b in c.list_jobs(plain, who)]
    rows = jobs if filt.expand_arrays else squeue.compact_arrays(jobs)
    items = squeue.compile_format(squeue.SQUEUE_DEFAULT, squeue.job_fields(clock.now))
    return "".join(line + "\n" for line in squeue.render(items, rows, header=False))


def _queue(c, clock, seed: int) -> list[int]:
    rng = random.Random(seed)
    ids = []
    for i in range(40):
        who = rng.choice((ALICE, BOB))
        kind = rng.choice(("plain", "held", "array", "array", "named"))
        req = pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", name=f"job{i}" if kind == "named" else "",
                            hold=kind == "held", array="0-5%2" if kind == "array" else "",
                            time_limit_s=rng.choice((0, 60, 3600)))
        ids.append(c.submit(req, who)[0])
    for job_id in rng.sample(ids, 8):   # some start, some of those end, some are cancelled
        job = c.jobs.get(job_id)
        if job.phase != JobPhase.PENDING or job.hold:
            continue
        job = c._commit([(job, events.start(job, clock.now, (NodeAlloc(rng.choice(("n1", "n2")), (), 1),)))],
                        clock.now, 0)[0]
        clock.now += rng.uniform(1, 500)
        if rng.random() < 0.5:
            c._commit([(job, events.exited(job, clock.now, rng.choice((0, 3)), 0))], clock.now, 0)
    c.cancel(pb.JobFilter(job_ids=rng.sample(ids, 3)), 0, ROOT)
    return ids


def test_kept_rows_are_the_rows_airq_would_make_whatever_the_filter(controller):
    c, clock = controller
    _queue(c, clock, seed=7)
    filters = [pb.JobFilter(), pb.JobFilter(expand_arrays=True), pb.JobFilter(uids=[ALICE.uid]),
               pb.JobFilter(phases=[pb.JOB_PHASE_PENDING]), pb.JobFilter(partitions=["p"]),
               pb.JobFilter(partitions=["elsewhere"]), pb.JobFilter(job_ids=[1, 2, 3])]
    for round_ in range(3):   # the second and third listing come from kept rows
        clock.now += 61
        for filt in filters:
            for who in (ALICE, ROOT):
                filt.rendered = True
                assert c.list_rows(filt, who) == _by_hand(c, clock, filt, who), (round_, filt, who)


def test_rows_made_ahead_of_any_listing_are_the_rows_airq_would_make(controller):
    c, clock = controller
    ids = _queue(c, clock, seed=11)
    made = 0
    while n := c.keep_rows(limit=7):
        made += n
    assert made and c.jobs.unrendered(10**6) == []
    for job_id in ids:   # every pending (no array's task) and ended job's row is kept, before a listing
        job = c.jobs.get(job_id)
        want = job.phase == JobPhase.DONE or job.phase == JobPhase.PENDING and not job.array_job_id
        assert (c.jobs.row(job) is not None) == want, job
    for filt in (pb.JobFilter(rendered=True), pb.JobFilter(rendered=True, expand_arrays=True),
                 pb.JobFilter(rendered=True, uids=[BOB.uid])):
        for who in (ALICE, ROOT):
            assert c.list_rows(filt, who) == _by_hand(c, clock, filt, who), (filt, who)
    held = next(c.jobs.get(i) for i in ids if c.jobs.get(i).hold)
    c.hold(pb.JobFilter(job_ids=[held.job_id]), False, ROOT)   # a change: its row is made again
    assert [j.job_id for j in c.jobs.unrendered(10)] == [held.job_id]
    job = c.jobs.get(held.job_id)   # a job that starts first: its row (TIME moves) is neither kept nor made
    started = c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", (), 1),)))], clock.now, 0)[0]
    assert c.jobs.unrendered(10) == [] and c.keep_rows() == 0 and c.jobs.row(started) is None
    done = c._commit([(started, events.exited(started, clock.now + 9, 0, 0))], clock.now + 9, 0)[0]
    assert c.jobs.unrendered(10) == [done]
    c.jobs.remove(done.job_id)   # forgotten (retention) before its row is made
    assert c.keep_rows() == 0 and c.jobs.unrendered(10) == []


def test_rows_are_not_made_ahead_while_a_listing_makes_many_on_its_way(controller, monkeypatch):
    from air.airctld import controller as module
    c, clock = controller
    for _ in range(501):
        c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    real, ahead = module._row, []

    def row(items, job):   # what the thread would do while the listing makes its rows
        if not ahead:
            ahead.append(c.keep_rows())
        return real(items, job)
    monkeypatch.setattr(module, "_row", row)
    c.list_rows(pb.JobFilter(rendered=True), ROOT)
    assert ahead == [0]   # (a listing that makes the same rows would take twice as long)
    with c._making_rows(10):   # a listing that makes a few: the thread goes on
        c.jobs.put(evolve(c.jobs.get(1), reason=Reason.DEPENDENCY))
        assert c.keep_rows() == 1


def test_running_jobs_rows_made_by_a_listing_do_not_hold_the_thread_back(controller, monkeypatch):
    """A running job's row is made for each listing and never kept: many running jobs are no reason
    to keep pending jobs' rows waiting."""
    from air.airctld import controller as module
    c, clock = controller
    monkeypatch.setattr(module, "MANY_ROWS", 3)
    for _ in range(5):
        job = c.jobs.get(c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp"), ALICE)[0])
        c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", (), 1),)))], clock.now, 0)
    held, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    real, ahead = module._row, []

    def row(items, job):   # (the thread's own rows are made with the real _row)
        if not ahead:
            monkeypatch.setattr(module, "_row", real)
            ahead.append(c.keep_rows())
        return real(items, job)
    monkeypatch.setattr(module, "_row", row)
    text = c.list_rows(pb.JobFilter(rendered=True), ROOT)
    assert ahead == [1] and len(text.splitlines()) == 6
    assert c.jobs.row(c.jobs.get(held)) is not None


def test_a_row_that_cannot_be_made_is_not_tried_again_until_its_job_changes(controller, monkeypatch):
    from air.airctld import controller as module
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    real = module._row
    monkeypatch.setattr(module, "_row", lambda items, job: 1 / 0 if job.job_id == job_id else real(items, job))
    other, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    assert c.keep_rows() == 2 and c.keep_rows() == 0   # (logged, and not offered again)
    assert c.jobs.row(c.jobs.get(other)) is not None and c.jobs.row(c.jobs.get(job_id)) is None
    monkeypatch.undo()
    c.hold(pb.JobFilter(job_ids=[job_id]), False, ALICE)
    assert c.keep_rows() == 1 and c.jobs.row(c.jobs.get(job_id)) is not None


def test_a_row_changes_with_its_job_and_a_running_jobs_time_moves(controller):
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True, name="watched"), ALICE)
    every = pb.JobFilter(rendered=True)

    def row() -> list[str]:
        text = c.list_rows(every, ALICE)
        assert text == _by_hand(c, clock, every, ALICE)
        return text.split()

    assert row()[4:] == ["PD", "0:00", "1", "(JobHeldUser)"]
    c.hold(pb.JobFilter(job_ids=[job_id]), False, ALICE)
    assert row()[4:] == ["PD", "0:00", "1", "(None)"]
    job = c.jobs.get(job_id)
    c._commit([(job, events.start(job, clock.now, (NodeAlloc("n2", (), 1),)))], clock.now, 0)
    assert row()[4:] == ["R", "0:00", "1", "n2"]
    clock.now += 75
    assert row()[4:] == ["R", "1:15", "1", "n2"]
    job = c.jobs.get(job_id)
    c._commit([(job, events.stop(job, clock.now, JobResult.CANCELLED, Reason.CANCELLED))], clock.now, 0)
    job = c.jobs.get(job_id)
    c._commit([(job, events.exited(job, clock.now, 0, 15))], clock.now, 0)
    clock.now += 100
    assert row()[4:] == ["CA", "1:15", "1", "n2"]


def test_a_row_made_from_a_job_that_changed_meanwhile_is_never_kept_for_the_new_one(controller):
    # a listing renders outside the controller's lock: the job may change between its pick and its row
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    old = c.jobs.get(job_id)
    c.hold(pb.JobFilter(job_ids=[job_id]), False, ALICE)
    c.jobs.keep_row(old, "stale row")
    assert c.jobs.row(c.jobs.get(job_id)) is None and c.jobs.row(old) is None
    assert "stale" not in c.list_rows(pb.JobFilter(rendered=True), ALICE)


def _ids(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines()]


def test_filters_and_privacy_pick_the_rows_a_user_expects(controller, tmp_path):
    # expected rows written out by hand: what each user submitted, under each filter
    from air.airctld.controller import Controller
    from air.airctld.store import Store
    c, clock = controller
    c.stop()
    conf = c.config
    private = replace(conf, controller=replace(conf.controller, private_jobs=True))
    c = Controller(private, Store(str(tmp_path / "private.db")), clock=clock, monotonic=clock)
    try:
        base = dict(script="#!/bin/sh\n", workdir="/tmp", hold=True)
        a1 = c.submit(pb.JobRequest(name="a1", **base), ALICE)[0]
        b1 = c.submit(pb.JobRequest(name="b1", **base), BOB)[0]
        arr = c.submit(pb.JobRequest(name="arr", array="0-2", **base), ALICE)[0]
        a2 = c.submit(pb.JobRequest(name="a2", **base), ALICE)[0]
        assert c.jobs.get(a2).partition == "p"

        def rows(who, **f):
            return _ids(c.list_rows(pb.JobFilter(rendered=True, **f), who))
        assert rows(ROOT) == [str(a1), str(b1), f"{arr}_[0-2]", str(a2)]
        assert rows(ROOT, expand_arrays=True) == [str(a1), str(b1), f"{arr}_0", f"{arr}_1", f"{arr}_2", str(a2)]
        assert rows(BOB) == [str(b1)] and rows(BOB, uids=[ALICE.uid]) == []   # private_jobs: his own only
        assert rows(ALICE) == [str(a1), f"{arr}_[0-2]", str(a2)]
        assert rows(ROOT, uids=[BOB.uid]) == [str(b1)]
        assert rows(ROOT, names=["a2", "b1"]) == [str(b1), str(a2)]
        assert rows(ROOT, partitions=["elsewhere"]) == [] and len(rows(ROOT, partitions=["p", "x"])) == 4
        assert rows(ROOT, job_ids=[arr]) == [f"{arr}_[0-2]"]
        assert rows(ROOT, array_tasks=[pb.ArrayTask(array_job_id=arr, task_id=1)]) == [f"{arr}_1"]
        c.cancel(pb.JobFilter(array_tasks=[pb.ArrayTask(array_job_id=arr, task_id=1)]), 0, ALICE)
        assert rows(ROOT) == [str(a1), str(b1), f"{arr}_[0,2]", f"{arr}_1", str(a2)]
    finally:
        c.stop()


def test_a_filter_naming_too_much_is_refused_before_it_holds_the_controller(controller):
    import pytest
    from air.airctld.errors import InvalidRequest
    from air.protos.limits import MAX_FILTER_ITEMS
    c, clock = controller
    c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    for field in ("partitions", "names"):
        with pytest.raises(InvalidRequest, match="at most"):
            c.list_rows(pb.JobFilter(rendered=True, **{field: ["x"] * (MAX_FILTER_ITEMS + 1)}), ALICE)
    with pytest.raises(InvalidRequest, match="at most"):
        c.cancel(pb.JobFilter(uids=list(range(MAX_FILTER_ITEMS + 1))), 0, ALICE)
    assert len(c.list_rows(pb.JobFilter(rendered=True, names=["x"] * MAX_FILTER_ITEMS), ALICE)) == 0


def test_a_row_for_a_job_forgotten_meanwhile_is_not_kept(controller):
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    job = c.jobs.get(job_id)
    c.jobs.remove(job_id)
    c.jobs.keep_row(job, "row of a forgotten job")
    assert job_id not in c.jobs._rows


def _changed(value):
    """Another value of the same kind."""
    import enum
    if isinstance(value, enum.Enum):
        members = list(type(value))
        return members[(members.index(value) + 1) % len(members)]
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7 if value else 1234
    if isinstance(value, str):
        return value + "x" if value else "something"
    if isinstance(value, tuple):
        return (NodeAlloc("n2", (1,), 2),) if value != (NodeAlloc("n2", (1,), 2),) else ()
    if isinstance(value, pb.JobRequest):
        other = pb.JobRequest()
        other.CopyFrom(value)
        other.name += "-renamed"
        return other
    raise AssertionError(f"no other value for {value!r}")


def test_whatever_field_of_a_job_changes_its_kept_row_is_what_airq_would_make(controller):
    # every field of the job model, one at a time, against a fresh rendering: a field the row shows that
    # the kept-row check misses shows up here, also one added to the model later
    import dataclasses
    from air.airctld.model import Job, evolve
    c, clock = controller
    # with include_old, and as a plain airq asks (the table's list of plain pending rows, see listing)
    filters = [pb.JobFilter(rendered=True, include_old=True, expand_arrays=True), pb.JobFilter(rendered=True),
               pb.JobFilter(rendered=True, expand_arrays=True)]
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", name="base", nodes=1), ALICE)
    pending = c.jobs.get(job_id)
    ended = evolve(pending, phase=JobPhase.DONE, result=JobResult.COMPLETED, start_time=clock.now - 90,
                   end_time=clock.now - 5, allocation=(NodeAlloc("n1", (0,), 1),), array_job_id=job_id,
                   array_task_id=3)
    long_ago = evolve(ended, end_time=clock.now - c.config.controller.min_job_age_s - 1, array_job_id=0)
    kept_through = set()
    for base in (pending, ended, long_ago):
        for f in dataclasses.fields(Job):
            if f.name == "job_id":
                continue
            c.jobs.put(base)
            for every in filters:
                assert c.list_rows(every, ROOT) == _by_hand(c, clock, every, ROOT)   # (now kept)
            assert c.jobs.row(base) is not None
            changed = evolve(base, **{f.name: _changed(getattr(base, f.name))})
            c.jobs.put(changed)
            if c.jobs.row(changed) is not None:
                kept_through.add(f.name)
            for every in filters:
                assert c.list_rows(every, ROOT) == _by_hand(c, clock, every, ROOT), (f.name, every)
    assert {"priority", "reason_detail", "figures", "exit_code"} <= kept_through   # a new priority keeps the row


def test_naming_an_array_many_times_is_one_array_and_a_huge_one_is_refused(controller, monkeypatch):
    import time
    import pytest
    from air.airctld import controller as controller_module
    from air.airctld.errors import InvalidRequest
    from air.protos.limits import MAX_FILTER_ITEMS
    c, clock = controller
    arr = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True, array="0-999"), BOB)[0]
    began = time.monotonic()
    rows = _ids(c.list_rows(pb.JobFilter(rendered=True, job_ids=[arr] * MAX_FILTER_ITEMS), ALICE))
    assert rows == [f"{arr}_[0-999]"] and time.monotonic() - began < 2.0
    monkeypatch.setattr(controller_module, "MAX_NAMED_JOBS", 999)
    with pytest.raises(InvalidRequest, match="stand for 1000 jobs"):
        c.list_rows(pb.JobFilter(rendered=True, job_ids=[arr]), ALICE)
    with pytest.raises(InvalidRequest, match="stand for 1000 jobs"):
        c.cancel(pb.JobFilter(array_tasks=[pb.ArrayTask(array_job_id=arr, task_id=5)]), 0, BOB)


def test_tasks_removed_by_retention_are_left_out_not_a_failure(controller):
    c, clock = controller
    arr = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True, array="0-2"), ALICE)[0]
    gone = arr + 1   # task 1: as if retention removed it from the store and memory
    with c.store.transaction():
        c.store.db.execute("DELETE FROM jobs WHERE id = ?", [gone])
    c.jobs.remove(gone)
    assert _ids(c.list_rows(pb.JobFilter(rendered=True, job_ids=[arr], expand_arrays=True), ALICE)) == \
        [f"{arr}_0", f"{arr}_2"]
    assert c.cancel(pb.JobFilter(job_ids=[arr]), 0, ALICE) == [arr, arr + 2]


def test_a_job_stored_before_qos_was_recorded_shows_the_default_it_ran_under(controller, tmp_path):
    from air.airctld.controller import Controller
    from air.airctld.store import Store
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    legacy = c.jobs.get(job_id)
    legacy.request.ClearField("qos")   # as a store from before the QOS was recorded keeps it
    with c.store.transaction():
        c.store.db.execute("UPDATE jobs SET request = ?, qos = '' WHERE id = ?",
                           [legacy.request.SerializeToString(), job_id])
    c.stop()
    conf = c.config
    standard = replace(conf, scheduler=replace(conf.scheduler, default_qos="standard"))
    again = Controller(standard, Store(str(tmp_path / "air.db")), clock=clock, monotonic=clock)
    try:
        assert [pb.Job.FromString(b).request.qos for b in again.list_jobs(pb.JobFilter(), ALICE)] == ["standard"]
        assert again.job_view(job_id, ALICE).request.qos == "standard"
        again.jobs.remove(job_id)   # (an old job, read from the store)
        assert again.job_view(job_id, ALICE).request.qos == "standard"
    finally:
        again.stop()


def test_jobs_that_ended_long_ago_are_listed_by_id_and_skipped_by_a_cancel_of_many(controller):
    # jobs only in the store (forgotten from memory): a listing by id shows them, read in one query of
    # a few hundred ids at a time; a cancel naming many ignores them (nothing acts on an ended job)
    c, clock = controller
    arr = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True, array="0-599"), ALICE)[0]
    c.cancel(pb.JobFilter(job_ids=[arr]), 0, ALICE)
    live = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)[0]
    for i in c._arrays[arr]:
        c.jobs.remove(i)
    rows = c.list_rows(pb.JobFilter(rendered=True, job_ids=[arr], expand_arrays=True), ALICE).splitlines()
    assert len(rows) == 600 and all(r.split()[-4] == "CA" for r in rows)
    assert {r.split()[0] for r in rows} == {f"{arr}_{t}" for t in range(600)}
    assert c.cancel(pb.JobFilter(job_ids=[arr, live]), 0, ALICE) == [live]
    assert c.cancel(pb.JobFilter(array_tasks=[pb.ArrayTask(array_job_id=arr, task_id=7),
                                              pb.ArrayTask(array_job_id=arr, task_id=8)]), 0, ALICE) == []
    import pytest
    from air.airctld.errors import Conflict, InvalidRequest, NotFound
    with pytest.raises(Conflict, match="cancelled; cannot cancel it"):
        c.cancel(pb.JobFilter(array_tasks=[pb.ArrayTask(array_job_id=arr, task_id=7)]), 0, ALICE)
    with pytest.raises(NotFound, match=f"job {arr}_600 does not exist"):
        c.cancel(pb.JobFilter(array_tasks=[pb.ArrayTask(array_job_id=arr, task_id=600)]), 0, ALICE)
    with pytest.raises(NotFound, match="job 99999 does not exist"):
        c.cancel(pb.JobFilter(job_ids=[live, 99999]), 0, ALICE)
    with pytest.raises(InvalidRequest, match="2\\^62"):
        c.list_rows(pb.JobFilter(rendered=True, job_ids=[1 << 63]), ALICE)
    assert arr not in c.jobs._brief   # (a job read from the store is not kept)


def test_replies_encoded_by_hand_are_the_messages_protobuf_would_write():
    """airctld writes ListJobsReply itself (no copy through a message); protobuf is the reference."""
    from air.airctld.service import encode_job_list, encode_rows
    for rows in ("", "a\n", "     1 p x root PD 0:00 1 (None)\n" * 5000, "ünïcødé 名前\n", "x" * 127, "x" * 128,
                 "y" * 16384):
        assert encode_rows(rows) == pb.ListJobsReply(rendered=rows).SerializeToString()
        assert pb.ListJobsReply.FromString(encode_rows(rows)).rendered == rows
    jobs = [pb.Job(job_id=i, user="u" * i) for i in (1, 2, 200)]
    assert pb.ListJobsReply.FromString(encode_job_list([j.SerializeToString() for j in jobs])).jobs == jobs


def test_a_plain_airq_shows_the_jobs_a_controller_without_rendered_rows_sends(monkeypatch, capsys):
    """A controller from before rendered rows answers a plain airq with its jobs: airq renders them."""
    from air.aircli import client, queue
    sent = []

    class Older:
        def __init__(self, config=None):
            pass

        def list_jobs_fields(self, request, **options):
            sent.append(request)
            return {"jobs": [pb.Job(job_id=7, user="alice", partition="gpu", phase=JobPhase.PENDING,
                                    reason=Reason.PRIORITY, request=pb.JobRequest(nodes=1, name="old")).SerializeToString()],
                    "rendered": ""}

    monkeypatch.setattr(client, "Client", Older)
    assert client.run(queue.command, "airq", ["-h", "-u", "0", "-j", "7"]) == 0
    assert capsys.readouterr().out.split() == ["7", "gpu", "old", "alice", "PD", "0:00", "1", "(Priority)"]
    assert sent == [{"uids": [0], "job_ids": [7], "array_tasks": [], "rendered": True, "expand_arrays": False}]


@pytest.mark.parametrize("stdout", ["bytes", "text only", "latin-1"])
def test_a_plain_airq_writes_its_header_then_the_rows_sent_whatever_its_stdout(monkeypatch, stdout):
    """The rows are written as the controller sent them (UTF-8 bytes) where stdout takes them, and
    decoded where it is text only (no buffer) or in another encoding."""
    import contextlib
    import io
    from air.aircli import client, queue
    rows = "      7       gpu     café    alice PD       0:00      1 (Priority)\n"

    class Current:
        def __init__(self, config=None):
            pass

        def list_jobs_fields(self, request, **options):
            data = pb.ListJobsReply(rendered=rows).SerializeToString()
            from air.protos import protowire, schemas
            return protowire.decode(schemas.ListJobsReply, data, options.get("as_sent", frozenset()))

    monkeypatch.setattr(client, "Client", Current)
    raw = io.BytesIO()
    out = io.StringIO() if stdout == "text only" else \
        io.TextIOWrapper(raw, encoding="utf-8" if stdout == "bytes" else "latin-1")
    with contextlib.redirect_stdout(out):
        assert client.run(queue.command, "airq", []) == 0
        out.flush()
    text = out.getvalue() if stdout == "text only" else \
        raw.getvalue().decode("utf-8" if stdout == "bytes" else "latin-1")
    head, row = text.splitlines()
    assert head.split() == ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES", "NODELIST(REASON)"]
    assert row + "\n" == rows
