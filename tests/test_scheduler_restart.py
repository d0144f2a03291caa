"""The controller's dependency judgements and the plan it applies, with a store on disk and a clock
in the test's hands (no node daemons): the same judgement before and after a restart, and nothing
started that changed while the pass was planned."""
import pytest

from air.airctld import events
from air.protos import config as cfg
from air.airctld.controller import Controller
from air.airctld.model import NodeAlloc
from air.airctld.store import Store
from fakeclock import Clock
from air.protos import air_pb2 as pb
from air.protos.credential import Identity
from air.protos.states import JobPhase, JobResult, Reason

ROOT = Identity(0, 0)



@pytest.fixture
def make(tmp_path):
    conf = cfg.parse({"controller": {"auth": "none", "state_dir": str(tmp_path), "min_job_age_s": 60},
                      "nodes": [{"name": "n1", "address": "127.0.0.9", "gpus": "sim:4"}],
                      "partitions": [{"name": "p", "nodes": "n1", "default": True}]})
    clock = Clock()
    made = []

    def build():
        c = Controller(conf, Store(str(tmp_path / "air.db")), clock=clock, monotonic=clock)
        made.append(c)
        return c
    yield build, clock
    for c in made:
        c.stop()


def _run_and_end(c, clock, job_id, code):
    job = c.jobs.get(job_id)
    started = c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", (0,), 1),)))], clock.now, 0)[0]
    c._commit([(started, events.exited(started, clock.now, code, 0))], clock.now, 0)


def _judge(c, dependency):
    dep = c.planner.dependency(type("J", (), {"job_id": -1, "request": pb.JobRequest(dependency=dependency)})())
    c.planner.forget(-1)
    from air.airctld import deps
    return deps.evaluate(dep, c._dep_states, True)


@pytest.mark.parametrize("dependency", ["afterok:{a}", "afternotok:{a}", "afterany:{a}", "after:{a}"])
def test_a_dependency_on_an_array_whose_tasks_ended_judges_the_same_after_a_restart(make, dependency):
    build, clock = make
    c = build()
    array_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", array="0-2"), ROOT)
    for k, task in enumerate(c._arrays[array_id]):
        _run_and_end(c, clock, task, 1 if k == 0 else 0)   # the first task fails: a judgement from the
        # last task alone (or from the array's first id, which is task 0's) would differ after the restart
    before = _judge(c, dependency.format(a=array_id))
    clock.now += 3600   # long done: forgotten from memory, in the store only
    c._forget_old(clock.now)
    assert _judge(c, dependency.format(a=array_id)) == before
    c.stop()
    assert _judge(build(), dependency.format(a=array_id)) == before


def test_afterok_on_a_requeued_job_waits_for_its_final_end_also_after_a_restart(make):
    build, clock = make
    c = build()
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp"), ROOT)
    job = c.jobs.get(job_id)
    job = c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", (0,), 1),)))], clock.now, 0)[0]
    job = c._commit([(job, events.preempted(job, clock.now, 99))], clock.now, 0)[0]
    assert _judge(c, f"afterok:{job_id}").name == "WAITING"
    c._commit([(job, events.finished(job, clock.now, 0, 15))], clock.now, 0)   # requeued: pending again
    assert c.jobs.get(job_id).phase == JobPhase.PENDING
    assert _judge(c, f"afterok:{job_id}").name == "WAITING"
    c.stop()
    assert _judge(build(), f"afterok:{job_id}").name == "WAITING"


def test_a_job_held_while_the_pass_is_planned_does_not_start(make, monkeypatch):
    build, clock = make
    c = build()
    c.nodes["n1"] = c.nodes["n1"].__class__(**{**c.nodes["n1"].__dict__, "cpus": 8, "state": 1,
                                               "gpus": tuple(pb.Gpu(index=i) for i in range(4))})
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=1), ROOT)
    launched = []
    monkeypatch.setattr(c.launcher, "launch", lambda job: launched.append(job.job_id))
    real = c.planner.inputs

    def hold_meanwhile(*args, **kw):   # the owner holds the job while the pass plans
        c.hold(pb.JobFilter(job_ids=[job_id]), True, ROOT)
        return real(*args, **kw)
    monkeypatch.setattr(c.planner, "inputs", hold_meanwhile)
    c._schedule(clock.now)
    job = c.jobs.get(job_id)
    assert job.phase == JobPhase.PENDING and job.hold and job.reason == Reason.JOB_HELD_USER
    assert launched == [] and job.result == JobResult.NONE


def _four_gpus(c):
    c.nodes["n1"] = c.nodes["n1"].__class__(**{**c.nodes["n1"].__dict__, "cpus": 8, "state": 1,
                                               "gpus": tuple(pb.Gpu(index=i) for i in range(4))})


def _pass_with(c, clock, monkeypatch, meanwhile):
    launched = []
    monkeypatch.setattr(c.launcher, "launch", lambda job: launched.append(job.job_id))
    real = c.planner.inputs

    def planning(*args, **kw):
        meanwhile()
        return real(*args, **kw)
    monkeypatch.setattr(c.planner, "inputs", planning)
    c._dirty = True
    c._schedule(clock.now)
    return launched


def test_holding_an_already_held_job_during_a_pass_stops_no_other_start(make, monkeypatch):
    build, clock = make
    c = build()
    _four_gpus(c)
    mine, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=1), ROOT)
    other, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=1, hold=True), ROOT)
    launched = _pass_with(c, clock, monkeypatch, lambda: c.hold(pb.JobFilter(job_ids=[other]), True, ROOT))
    assert launched == [mine] and c.jobs.get(mine).phase == JobPhase.RUNNING


def test_a_job_released_during_a_pass_stops_only_the_starts_it_ranks_at_or_above(make, monkeypatch):
    build, clock = make
    c = build()
    _four_gpus(c)
    from air.airctld.model import evolve
    low, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=1, nice=5000), ROOT)
    high, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=1), ROOT)
    held, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=1, hold=True), ROOT)
    c.jobs.put(evolve(c.jobs.get(held), priority=8000))   # the priority the last pass gave it
    launched = _pass_with(c, clock, monkeypatch, lambda: c.hold(pb.JobFilter(job_ids=[held]), False, ROOT))
    pri = {j: c.jobs.get(j).priority for j in (low, high)}
    assert pri[low] <= 8000 < pri[high], pri
    assert launched == [high] and c.jobs.get(low).phase == JobPhase.PENDING


def test_a_preemptor_keeps_its_hold_while_user_held_or_fenced_and_loses_it_when_it_leaves(make, monkeypatch):
    build, clock = make
    c = build()
    _four_gpus(c)
    monkeypatch.setattr(c.launcher, "launch", lambda job: None)
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=1, hold=True), ROOT)
    other, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=1, hold=True), ROOT)
    c._holds[job_id] = ("n1",)
    c._dirty = True
    c._schedule(clock.now)                               # held by its owner: still in the queue
    assert c._holds == {job_id: ("n1",)}
    c.hold(pb.JobFilter(job_ids=[job_id]), False, ROOT)
    c.fence_wait[job_id] = {"n1": clock.now + 100}       # its last run's node may still run it
    c._schedule(clock.now)
    assert c._holds == {job_id: ("n1",)} and c.jobs.get(job_id).phase == JobPhase.PENDING
    c.cancel(pb.JobFilter(job_ids=[job_id]), 0, ROOT)
    c._dirty = True
    c._schedule(clock.now)
    assert c._holds == {}


@pytest.fixture
def make_qos(tmp_path):
    conf = cfg.parse({"controller": {"auth": "none", "state_dir": str(tmp_path), "min_job_age_s": 60},
                      "scheduler": {"preempt_grace_s": 30},
                      "qos": [{"name": "normal"}, {"name": "high", "priority": 10, "preempt": ["normal"]}],
                      "nodes": [{"name": "n1", "address": "127.0.0.9", "gpus": "sim:4"}],
                      "partitions": [{"name": "p", "nodes": "n1", "default": True}]})
    clock = Clock()
    made = []

    def build(monkeypatch):
        c = Controller(conf, Store(str(tmp_path / "air.db")), clock=clock, monotonic=clock)
        made.append(c)
        _four_gpus(c)
        monkeypatch.setattr(c.launcher, "launch", lambda job: None)
        monkeypatch.setattr(c, "_send_signal", lambda *a, **kw: None)
        return c
    yield build, clock
    for c in made:
        c.stop()


def test_a_preemptors_hold_and_its_victims_stop_time_survive_a_restart_until_they_end(make_qos, monkeypatch):
    build, clock = make_qos
    c = build(monkeypatch)
    whole = dict(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=4, time_limit_s=3600)
    victim, _ = c.submit(pb.JobRequest(**whole), ROOT)
    c._schedule(clock.now)
    assert c.jobs.get(victim).phase == JobPhase.RUNNING
    asked = clock.now = clock.now + 10
    boss, _ = c.submit(pb.JobRequest(qos="high", **whole), ROOT)
    c._schedule(clock.now)
    assert c.jobs.get(victim).phase == JobPhase.COMPLETING and c.jobs.get(victim).reason == Reason.PREEMPTED
    assert c._holds == {boss: ("n1",)} and c._stopped_at == {victim: asked}
    c.stop()

    clock.now += 5   # restarted before the victim's grace ran out: the same hold, the same stop time
    c = build(monkeypatch)
    assert c._holds == {boss: ("n1",)} and c._stopped_at == {victim: asked}
    other, _ = c.submit(pb.JobRequest(nice=-5000, **whole), ROOT)   # above the preemptor, asks for n1 too
    c._schedule(clock.now)
    assert c.planner.plan.preempt == {}
    assert c.planner.plan.estimate()[boss].start == asked + 30 and c.planner.plan.estimate()[boss].nodes == ("n1",)
    assert c.jobs.get(other).phase == JobPhase.PENDING

    clock.now = asked + 30   # the victim is gone (requeued); the preemptor starts and gives the hold up
    c._commit([(c.jobs.get(victim), events.finished(c.jobs.get(victim), clock.now, 0, 9))], clock.now, 0)
    assert c._stopped_at == {}
    c._schedule(clock.now)
    assert c.jobs.get(boss).phase == JobPhase.RUNNING and c._holds == {}
    c.stop()
    c = build(monkeypatch)
    assert c._holds == {} and c._stopped_at == {} and c.store.load_holds() == {} and c.store.load_stop_times() == {}


def test_step_numbers_go_on_after_a_restart(make):
    """A job's steps are numbered 0, 1, ... and a restarted controller goes on from the last one: a
    number is never given twice (a node may still run, or adopt, the step that had it)."""
    build, clock = make
    c = build()
    c.clients = type("Nodes", (), {"prepare_step": lambda self, address, step: pb.PrepareStepReply(free_port=1)})()
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp"), ROOT)
    job = c.jobs.get(job_id)
    c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", (0,), 1),)))], clock.now, 0)
    spec = pb.StepSpec(job_id=job_id, argv=["python", "train.py"])
    assert [c.create_step(spec, ROOT).step_id for _ in range(2)] == [0, 1]
    c.stop()
    c = build()   # kill -9 and start again: what the store says
    c.clients = type("Nodes", (), {"prepare_step": lambda self, address, step: pb.PrepareStepReply(free_port=1)})()
    assert c.create_step(spec, ROOT).step_id == 2
    assert c.store._rows("SELECT step_id, command FROM steps WHERE job_id = ?", [job_id]) == [
        (0, "python train.py"), (1, "python train.py"), (2, "python train.py")]
    # requeued (its node was lost), a restart while it waits, then its next run's steps go on too
    job = c.jobs.get(job_id)
    c._commit([(job, events.requeued(job, clock.now, Reason.NODE_FAIL))], clock.now, 0)
    c.stop()
    c = build()
    c.clients = type("Nodes", (), {"prepare_step": lambda self, address, step: pb.PrepareStepReply(free_port=1)})()
    job = c.jobs.get(job_id)
    c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", (0,), 1),)))], clock.now, 0)
    assert c.create_step(spec, ROOT).step_id == 3


def test_a_started_controller_works_priorities_out_before_its_first_pass(make):
    """The priority cache's first fill is the dearest part of a pass: a controller does it once as it
    starts, so its first pass costs what a later one does (bench/bench_scheduler.py's later pass)."""
    build, clock = make
    c = build()
    ids = [c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=k == 0), ROOT)[0] for k in range(3)]
    c.stop()
    c = build()
    assert c.planner.priorities._rows == {}
    c.prime()
    assert sorted(c.planner.priorities._rows) == ids   # pending and held alike


def test_a_requeued_job_held_across_a_restart_still_waits_for_its_fence(make):
    """Its last run may still be alive on a node that has not fenced itself yet: releasing it after
    the restart does not let it start before that node's fence time."""
    build, clock = make
    c = build()
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp"), ROOT)
    job = c.jobs.get(job_id)
    started = c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", (0,), 1),)))], clock.now, 0)[0]
    requeued = c._commit([(started, events.requeued(started, clock.now, Reason.NODE_FAIL))], clock.now, 0)[0]
    c._commit([(requeued, events.held(requeued, True))], clock.now, 0)
    c.stop()
    c = build()
    assert job_id in c.fence_wait


def test_a_job_may_start_only_so_many_steps(make, tmp_path):
    """Each step is a row kept with the job: a loop of airrun calls stops at max_steps_per_job."""
    from air.airctld.errors import Conflict
    build, clock = make
    c = build()
    c.config = cfg.parse({"controller": {"auth": "none", "state_dir": str(tmp_path), "max_steps_per_job": 2},
                          "nodes": [{"name": "n1", "address": "127.0.0.9", "gpus": "sim:4"}],
                          "partitions": [{"name": "p", "nodes": "n1", "default": True}]})
    c.clients = type("Nodes", (), {"prepare_step": lambda self, address, step: pb.PrepareStepReply(free_port=1)})()
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp"), ROOT)
    job = c.jobs.get(job_id)
    c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", (0,), 1),)))], clock.now, 0)
    spec = pb.StepSpec(job_id=job_id, argv=["true"])
    assert [c.create_step(spec, ROOT).step_id for _ in range(2)] == [0, 1]
    with pytest.raises(Conflict, match="has started 2 steps, its limit"):
        c.create_step(spec, ROOT)
    assert c.store.last_step_id(job_id) == 1
