"""The store's contract, run against a file and against :memory:."""
import sqlite3

import pytest

from air.airctld import events
from air.airctld.model import Job, Node, NodeAlloc
from air.airctld.store import SCHEMA_VERSION, Store, StoreError
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, JobResult, NodeState, Reason


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path):
    s = Store(str(tmp_path / "air.db") if request.param == "file" else ":memory:")
    yield s
    s.close()


def _job(name="j"):
    return Job(job_id=0, uid=1000, gid=100, user="alice", name=name, partition="gpu", num_nodes=1,
               gpus_per_node=2, cpus_per_node=1, time_limit_s=60, submit_time=100.0,
               request=pb.JobRequest(name=name, script="#!/bin/sh\ntrue\n", environment={"A": "1"}))


def test_insert_get_round_trip_with_event(store):
    with store.transaction():
        job_id = store.insert_job(_job(), who=1000)
    got = store.get_job(job_id)
    assert got.job_id == job_id and got.user == "alice" and got.request.environment["A"] == "1"
    assert got.phase == JobPhase.PENDING
    assert [e["new_state"] for e in store.events(job_id)] == ["PENDING"]


def test_every_field_of_a_job_comes_back_as_it_was_written(store):
    # each field a value no other has: a column written in another's place cannot go unseen
    with store.transaction():
        job_id = store.insert_job(_job(), who=1000)
    job = Job(job_id=job_id, uid=1001, gid=1002, user="carol", name="n", partition="part", num_nodes=3,
              gpus_per_node=4, cpus_per_node=5, time_limit_s=6, submit_time=7.5, priority=8,
              phase=JobPhase.COMPLETING, result=JobResult.TIMEOUT, reason=Reason.TIME_LIMIT, reason_detail="d",
              hold=True, allocation=(NodeAlloc("node09", (2, 3), 11),), start_time=12.5, end_time=13.5,
              exit_code=14, exit_signal=15, restart_count=16, last_stop_reason=Reason.PREEMPTED,
              array_job_id=17, array_task_id=18, figures="f", request=pb.JobRequest(name="n", script="s"))
    with store.transaction():
        store.update_job(store.get_job(job_id), job, 20.0, who=0)
    assert store.get_job(job_id) == job
    with store.transaction():
        again = store.insert_job(job, who=0)
    assert store.get_job(again) == Job(**{**job.__dict__, "job_id": again})


def test_update_writes_an_event_per_state_change(store):
    with store.transaction():
        job_id = store.insert_job(_job(), who=1000)
    job = store.get_job(job_id)
    started = events.start(job, 110.0, (NodeAlloc("node01", (0, 1), 1),))
    done = events.exited(started, 120.0, 0, 0)
    with store.transaction():
        store.update_job(job, started, 110.0, who=-1)
    with store.transaction():
        store.update_job(started, done, 120.0, who=-1)
    got = store.get_job(job_id)
    assert got.result == JobResult.COMPLETED and got.allocation == (NodeAlloc("node01", (0, 1), 1),)
    assert [(e["old_state"], e["new_state"]) for e in store.events(job_id)] == [
        ("", "PENDING"), ("PENDING", "RUNNING"), ("RUNNING", "COMPLETED")]


def test_a_requeue_is_recorded_with_why_the_run_stopped(store):
    with store.transaction():
        job_id = store.insert_job(_job(), who=1000)
    job = store.get_job(job_id)
    started = events.start(job, 110.0, (NodeAlloc("node01", (0, 1), 1),))
    again = events.requeued(started, 130.0, Reason.NODE_FAIL, "node01 stopped answering")
    with store.transaction():
        store.update_jobs([(job, started), (started, again)], 130.0, who=-1)
    last = store.events(job_id)[-1]
    assert (last["old_state"], last["new_state"], last["reason"]) == ("RUNNING", "PENDING", "NODE_FAIL")
    assert last["detail"] == "node01 stopped answering"


def test_failed_transaction_changes_nothing(store):
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.insert_job(_job(), who=0)
            raise RuntimeError("boom")
    assert store.get_job(1) is None and store.events(1) == []


def test_ids_grow_and_are_never_reused(store):
    with store.transaction():
        a = store.insert_job(_job(), 0)
        b = store.insert_job(_job(), 0)
    store.db.execute("DELETE FROM jobs WHERE id = ?", [b])
    with store.transaction():
        c = store.insert_job(_job(), 0)
    assert a < b < c and store.max_job_id() == c


def test_load_jobs_keeps_active_and_recent(store):
    with store.transaction():
        ids = [store.insert_job(_job(str(i)), 0) for i in range(3)]
    old = store.get_job(ids[0])
    done = events.stop(old, 50.0, JobResult.CANCELLED, pb.REASON_CANCELLED)
    recent = events.stop(store.get_job(ids[1]), 500.0, JobResult.CANCELLED, pb.REASON_CANCELLED)
    with store.transaction():
        store.update_job(old, done, 50.0, 0)
        store.update_job(store.get_job(ids[1]), recent, 500.0, 0)
    assert [j.job_id for j in store.load_jobs(done_since=100.0)] == ids[1:]


def test_nodes_round_trip(store):
    node = Node(name="node01", address="127.0.0.2:6818", cpus=8, memory_mb=1024,
                gpus=(pb.Gpu(index=0, uuid="GPU-x", name="sim", memory_mb=80),), state=NodeState.UP,
                last_heartbeat=5.0)
    with store.transaction():
        store.save_node(node)
        store.save_node(Node(**{**node.__dict__, "state": NodeState.DOWN, "reason": "gone"}))
    [got] = store.load_nodes()
    assert got.state == NodeState.DOWN and got.reason == "gone" and got.gpus[0].uuid == "GPU-x"


def test_file_store_survives_reopen_in_wal_mode(tmp_path):
    path = str(tmp_path / "air.db")
    s = Store(path)
    with s.transaction():
        first = s.insert_job(_job(), 0)
    s.close()
    s = Store(path)
    with s.transaction():
        second = s.insert_job(_job(), 0)
    assert second == first + 1
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    s.close()


def test_newer_schema_is_refused(tmp_path):
    path = str(tmp_path / "air.db")
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this airctld knows"):
        Store(path)


def test_preemption_holds_and_stop_times_round_trip_and_roll_back_with_their_transaction(store):
    with store.transaction():
        store.save_holds({7: ("n2", "n1"), 8: ("n3",)})
        store.add_stop_times([(3, 50.0), (4, 60.0)])
    with store.transaction():
        store.save_holds({7: ("n1", "n2", "n4")})     # a second round of victims: the whole set again
        store.add_stop_times([(3, 99.0)])             # asked again: the first time stays
    assert store.load_holds() == {7: ("n1", "n2", "n4"), 8: ("n3",)}
    assert store.load_stop_times() == {3: 50.0, 4: 60.0}
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.remove_holds([7, 8])
            store.remove_stop_times([3])
            raise RuntimeError("boom")
    assert store.load_holds() == {7: ("n1", "n2", "n4"), 8: ("n3",)} and store.load_stop_times()[3] == 50.0
    with store.transaction():
        store.remove_holds([7])
        store.remove_stop_times([3, 4])
    assert store.load_holds() == {8: ("n3",)} and store.load_stop_times() == {}


def test_a_store_of_schema_6_migrates_to_one_without_holds_or_stop_times(tmp_path):
    path = str(tmp_path / "air.db")
    s = Store(path)
    s.db.execute("DROP TABLE preempt_holds")
    s.db.execute("DROP TABLE stop_times")
    s.db.execute("DROP TABLE preemptions")
    _undo_schema_10(s)
    s.db.execute("DROP TABLE steps")
    s.db.execute("PRAGMA user_version = 6")
    s.close()
    s = Store(path)
    assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert s.load_holds() == {} and s.load_stop_times() == {} and s.load_preemptions() == {}
    s.close()


def _undo_schema_10(s: Store) -> None:
    for column in ("end_time", "exit_code", "exit_signal", "cancelled"):   # (schema 12's and 11's, first)
        s.db.execute(f"ALTER TABLE steps DROP COLUMN {column}")
    s.db.execute("ALTER TABLE jobs DROP COLUMN figures")
    for index in ("jobs_uid_end", "jobs_account_end"):
        s.db.execute(f"DROP INDEX {index}")
    s.db.execute("ALTER TABLE jobs DROP COLUMN account")
    s.db.execute("ALTER TABLE jobs DROP COLUMN qos")
    s.db.execute("DROP TABLE runs")


def test_a_store_of_schema_9_gains_history_with_its_jobs_accounts_and_qos(tmp_path):
    path = str(tmp_path / "air.db")
    s = Store(path)
    job = _job()
    job.request.account, job.request.qos = "vision", "high"
    with s.transaction():
        job_id = s.insert_job(job, who=1000)
    _undo_schema_10(s)
    s.db.execute("PRAGMA user_version = 9")
    s.close()
    s = Store(path)
    assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    found, _ = s.history(pb.HistoryRequest(accounts=["vision"], qos=["high"]), 10)
    assert [e.job.job_id for e in found] == [job_id]
    assert s.history(pb.HistoryRequest(accounts=["ml"]), 10) == ([], False)
    s.close()


def test_who_preempted_whom_is_kept_until_the_preemptor_is_forgotten(tmp_path):
    store = Store(str(tmp_path / "air.db"))
    with store.transaction():
        store.add_preemptions([(7, 3), (7, 4), (8, 3), (7, 3)])
    store.close()
    store = Store(str(tmp_path / "air.db"))   # a restarted controller
    assert store.load_preemptions() == {7: {3, 4}, 8: {3}}
    with store.transaction():
        store.remove_preemptions([7])
    assert store.load_preemptions() == {8: {3}}


def test_a_store_of_schema_12_keeps_only_ended_jobs_in_its_end_time_indexes(tmp_path):
    path = str(tmp_path / "air.db")
    s = Store(path)
    with s.transaction():
        ended, waiting = s.insert_job(_job("a"), who=1000), s.insert_job(_job("b"), who=1000)
        job = s.get_job(ended)
        s.update_job(job, events.stop(job, 150.0, JobResult.CANCELLED, Reason.CANCELLED), 150.0, who=0)
    for name, columns in (("jobs_end", "end_time"), ("jobs_uid_end", "uid, end_time"),
                          ("jobs_account_end", "account, end_time")):   # schema 12's: every job
        s.db.execute(f"DROP INDEX {name}")
        s.db.execute(f"CREATE INDEX {name} ON jobs ({columns})")
    s.db.execute("PRAGMA user_version = 12")
    s.close()
    s = Store(path)
    for name in ("jobs_end", "jobs_uid_end", "jobs_account_end"):
        sql = s.db.execute("SELECT sql FROM sqlite_master WHERE name = ?", [name]).fetchone()[0]
        assert sql.endswith("WHERE phase = 4"), sql
    # every query that names one of them still can use it (INDEXED BY fails where it cannot)
    for req in (pb.HistoryRequest(since=100.0), pb.HistoryRequest(since=100.0, uids=[1000]),
                pb.HistoryRequest(since=100.0, accounts=[""])):
        found, _ = s.history(req, 10)
        assert [e.job.job_id for e in found] == [ended, waiting]
    assert [j.job_id for j in s.jobs_ended_after(100.0)] == [ended]
    plan = s.db.execute("EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE end_time > 100 AND phase = 4").fetchall()
    assert "jobs_end" in str(plan)
    s.close()
