"""airrun's own allocation (srun outside a job), in a controller on a test clock: it lasts while airrun
renews it and ends at the inactive limit when airrun stops (Slurm's InactiveLimit), a controller
restart never ends it, only its owner gives it back, and a user's signal reaches its steps only.
Also scancel -s KILL: the whole job, pending ones too, at once."""
import signal

import pytest

from air.airctld import events
from air.airctld.admission import ALLOCATION_SCRIPT
from air.airctld.controller import Controller
from air.airctld.errors import Denied, InvalidRequest
from air.airctld.model import NodeAlloc
from air.airctld.store import Store
from air.protos import air_pb2 as pb
from air.protos.credential import Identity
from air.protos.states import JobPhase, JobResult, Reason
from test_runs_controller import _beat

ALICE, BOB = Identity(4242, 4242), Identity(4343, 4343)
LIMIT = 60.0   # ControllerConfig.inactive_limit_s, the default


def _running(c, clock, who=ALICE, allocation=True) -> int:
    req = pb.JobRequest(allocation=True, workdir="/tmp") if allocation else \
        pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp")
    job_id, _ = c.submit(req, who)
    pending = c.jobs.get(job_id)
    c._commit([(pending, events.start(pending, clock.now, (NodeAlloc("n1", (0,), 1),)))], clock.now, 0)
    return job_id


def _tick(c, *job_ids):
    _beat(c, "n1", runs=[(j, 0) for j in job_ids])
    _beat(c, "n2")
    c.tick()


def _wait(c, clock, seconds, *job_ids):
    """Time passes as it does for a controller that ticks every few seconds."""
    while seconds > 0:
        clock.now += min(5.0, seconds)
        seconds -= 5.0
        _tick(c, *job_ids)


def _signals(c) -> list:
    sent = []
    c._send_signal = lambda job, sig, grace=None, batch_only=False, steps_only=False: \
        sent.append((job.job_id, sig, grace, batch_only, steps_only))
    return sent


def test_an_allocation_lasts_while_airrun_renews_it_and_ends_at_the_limit_once_it_stops(controller):
    c, clock = controller
    leased, plain = _running(c, clock), _running(c, clock, allocation=False)
    for _ in range(3):   # renewed within the limit, three times over: it stays
        _wait(c, clock, LIMIT - 1, leased, plain)
        assert c.keep_alive(pb.JobFilter(job_ids=[leased]), ALICE) == [leased]
        assert c.jobs.get(leased).phase == JobPhase.RUNNING
    _wait(c, clock, LIMIT - 1, leased, plain)   # not renewed, but within the limit
    assert c.jobs.get(leased).phase == JobPhase.RUNNING
    _wait(c, clock, 2, leased, plain)
    job = c.jobs.get(leased)
    assert (job.phase, job.result, job.reason) == (JobPhase.COMPLETING, JobResult.TIMEOUT, Reason.INACTIVE_LIMIT)
    assert "did not renew" in job.reason_detail
    assert c.jobs.get(plain).phase == JobPhase.RUNNING   # a batch job has no lease


def test_only_the_owner_renews_or_releases_and_only_an_allocation_is_released(controller):
    c, clock = controller
    leased, plain = _running(c, clock), _running(c, clock, allocation=False)
    with pytest.raises(Denied):
        c.keep_alive(pb.JobFilter(job_ids=[leased]), BOB)
    with pytest.raises(Denied):
        c.cancel(pb.JobFilter(job_ids=[leased]), 0, BOB, release=1)
    with pytest.raises(InvalidRequest):
        c.keep_alive(pb.JobFilter(), ALICE)
    with pytest.raises(InvalidRequest, match="release 3"):
        c.cancel(pb.JobFilter(job_ids=[leased]), 0, ALICE, release=3)
    sent = _signals(c)
    assert c.cancel(pb.JobFilter(job_ids=[plain]), 0, ALICE, release=1) == [] and sent == []
    assert c.keep_alive(pb.JobFilter(job_ids=[plain]), ALICE) == []
    assert c.cancel(pb.JobFilter(job_ids=[leased]), 0, ALICE, release=1) == [leased]
    assert c.cancel(pb.JobFilter(job_ids=[leased]), 0, ALICE, release=2) == [leased]
    assert sent == [(leased, signal.SIGUSR1, None, True, False), (leased, signal.SIGUSR2, None, True, False)]


def test_a_users_signal_reaches_an_allocations_steps_never_its_shell(controller):
    c, clock = controller
    leased, plain = _running(c, clock), _running(c, clock, allocation=False)
    sent = _signals(c)
    for batch_only, steps_only in ((False, False), (True, False), (False, True)):   # aircancel -s, -b, scancel -s
        c.cancel(pb.JobFilter(job_ids=[leased, plain]), signal.SIGUSR1, ALICE, batch_only, steps_only)
    assert [s for s in sent if s[0] == leased] == [(leased, signal.SIGUSR1, None, False, True)] * 3
    assert [s[3:] for s in sent if s[0] == plain] == [(False, False), (True, False), (False, True)]


def test_an_allocation_is_airctlds_shell_and_never_requeued(controller):
    c, clock = controller
    leased = _running(c, clock)
    job = c.jobs.get(leased)
    assert job.request.script == ALLOCATION_SCRIPT and job.request.no_requeue and not job.requeue_allowed
    for bad in (pb.JobRequest(allocation=True, workdir="/tmp", script="#!/bin/sh\nrm -rf ~\n"),
                pb.JobRequest(allocation=True, workdir="/tmp", argv=["x"]),
                pb.JobRequest(allocation=True, workdir="/tmp", array="0-3")):
        with pytest.raises(InvalidRequest, match="allocation"):
            c.submit(bad, ALICE)


def test_a_frozen_controller_does_not_blame_airrun_for_the_renewals_it_did_not_take(controller):
    c, clock = controller
    leased = _running(c, clock)
    _tick(c, leased)
    clock.now += 3 * LIMIT   # airctld stopped (SIGSTOP, a stalled disk): airrun's renewals hang meanwhile
    _tick(c, leased)
    assert c.jobs.get(leased).phase == JobPhase.RUNNING
    for _ in range(6):   # and then airrun is gone: the lease runs out, looked at as usual
        clock.now += LIMIT / 5
        _tick(c, leased)
    assert c.jobs.get(leased).reason == Reason.INACTIVE_LIMIT


def test_a_controller_restart_gives_every_allocation_a_fresh_lease(controller, tmp_path):
    c, clock = controller
    leased = _running(c, clock)
    clock.now += LIMIT - 1
    c.stop()
    clock.now += 10 * LIMIT   # down for ten limits: airrun could not renew meanwhile
    again = Controller(c.config, Store(str(tmp_path / "air.db")), clock=clock, monotonic=clock)
    again.clients = c.clients
    try:
        for name in ("n1", "n2"):
            again.register(pb.Node(name=name, address=again.config.node(name).endpoint, cpus=8, memory_mb=1024,
                                   gpus=[pb.Gpu(index=i) for i in range(4)]))
        _tick(again, leased)
        assert again.jobs.get(leased).phase == JobPhase.RUNNING
        _wait(again, clock, LIMIT - 1, leased)
        assert again.jobs.get(leased).phase == JobPhase.RUNNING
        again.keep_alive(pb.JobFilter(job_ids=[leased]), ALICE)
        _wait(again, clock, LIMIT + 1, leased)
        assert again.jobs.get(leased).reason == Reason.INACTIVE_LIMIT
    finally:
        again.stop()


def test_sigkill_cancels_the_whole_job_at_once_pending_ones_too(controller):
    # scancel -s KILL, as Slurm's: the job is cancelled (its steps and batch shell killed with no grace),
    # and a pending job ends CANCELLED; any other signal leaves a pending job be
    c, clock = controller
    running = _running(c, clock, allocation=False)
    waiting, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    sent = _signals(c)
    assert c.cancel(pb.JobFilter(job_ids=[waiting]), signal.SIGUSR1, ALICE) == []
    assert c.jobs.get(waiting).phase == JobPhase.PENDING
    assert sorted(c.cancel(pb.JobFilter(job_ids=[running, waiting]), signal.SIGKILL, ALICE)) == [running, waiting]
    assert c.jobs.get(waiting).phase == JobPhase.DONE and c.jobs.get(waiting).result == JobResult.CANCELLED
    job = c.jobs.get(running)
    assert (job.phase, job.result) == (JobPhase.COMPLETING, JobResult.CANCELLED)
    assert sent == [(running, 0, None, False, False)] and running in c._no_grace   # (no grace: see below)
    # -b -s KILL: the batch shell only, a signal and no more
    other = _running(c, clock, allocation=False)
    assert c.cancel(pb.JobFilter(job_ids=[other]), signal.SIGKILL, ALICE, batch_only=True) == [other]
    assert c.jobs.get(other).phase == JobPhase.RUNNING and sent[-1] == (other, signal.SIGKILL, None, True, False)


def test_an_allocation_takes_no_signal_its_shell_would_die_of_and_is_never_retried(controller):
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(allocation=True, workdir="/tmp", warn_signal=signal.SIGUSR1, warn_time_s=60,
                                       warn_batch_only=True, hang_timeout_s=30, retries=3), ALICE)
    req = c.jobs.get(job_id).request
    assert (req.warn_signal, req.warn_batch_only, req.hang_timeout_s, req.retries) == (0, False, 0, 0)


def test_a_busy_controller_does_not_blame_airrun_for_renewals_waiting_for_a_worker(controller):
    from air.airctld.controller import RPC_WORKERS
    c, clock = controller
    leased = _running(c, clock)
    c.rpcs_in_flight.update(range(RPC_WORKERS))   # every RPC worker busy (sixteen heavy listings, say)
    _wait(c, clock, 3 * LIMIT, leased)
    assert c.jobs.get(leased).phase == JobPhase.RUNNING
    c.rpcs_in_flight.clear()
    _wait(c, clock, LIMIT + 5, leased)
    assert c.jobs.get(leased).reason == Reason.INACTIVE_LIMIT


def test_workers_kept_busy_for_ever_do_not_keep_a_dead_allocation_for_ever(controller):
    # (sixteen looping listings, say, by whoever: the excuse lasts SATURATION_CREDIT limits)
    from air.airctld.controller import RPC_WORKERS, SATURATION_CREDIT
    c, clock = controller
    leased = _running(c, clock)
    c.rpcs_in_flight.update(range(RPC_WORKERS))
    _wait(c, clock, SATURATION_CREDIT * LIMIT - 5, leased)
    assert c.jobs.get(leased).phase == JobPhase.RUNNING
    _wait(c, clock, LIMIT + 10, leased)
    assert c.jobs.get(leased).reason == Reason.INACTIVE_LIMIT


def test_every_rpc_counts_as_a_busy_worker_while_it_runs(controller):
    # what the busy-controller excuse reads: the service marks its worker for the length of each call
    from air.airctld.service import ControllerService

    class Auth:
        def identify(self, context, method, request, target, data=None):
            return ALICE

    c, clock = controller
    leased = _running(c, clock)
    seen = []
    real = c.keep_alive
    c.keep_alive = lambda filt, who: seen.append(len(c.rpcs_in_flight)) or real(filt, who)
    reply = ControllerService(c, Auth()).KeepAlive(pb.JobFilter(job_ids=[leased]), None)
    assert seen == [1] and not c.rpcs_in_flight and list(reply.job_ids) == [leased]
    assert reply.inactive_limit_s == LIMIT


def test_the_server_has_as_many_workers_as_the_controller_counts():
    import inspect
    from air.airctld import __main__ as daemon
    assert "ThreadPoolExecutor(max_workers=RPC_WORKERS)" in inspect.getsource(daemon)


def test_sigkill_of_a_job_being_launched_kills_it_at_once_when_its_launch_returns(controller):
    c, clock = controller
    job_id = _running(c, clock, allocation=False)
    c._launching.add((job_id, 0))
    delivered = []
    c._actions.submit = lambda fn, *args: fn(*args)
    c.clients.signal = lambda address, job, run, sig, grace, *rest: delivered.append((job, sig, grace))
    c.cancel(pb.JobFilter(job_ids=[job_id]), signal.SIGKILL, ALICE)
    assert delivered == []   # not yet: its launch has not returned
    c._send_signal(c.jobs.get(job_id), 0)   # as Launcher.launch does once it returns
    assert delivered == [(job_id, 0, 0.0)]
    other = _running(c, clock, allocation=False)
    c.cancel(pb.JobFilter(job_ids=[other]), 0, ALICE)   # a plain cancel keeps its grace
    assert delivered[-1] == (other, 0, c.config.controller.kill_wait_s)


def test_airrun_renews_at_the_controllers_pace_and_survives_a_failed_renewal(monkeypatch):
    import threading
    import time
    from air.aircli import run
    monkeypatch.setattr(run._Renewing, "FIRST_S", 0.05)
    calls, lock = [], threading.Lock()

    class Client:
        def keep_alive(self, request, timeout):
            return self.call("KeepAlive", request, timeout)

        def call(self, method, request, timeout):
            with lock:
                calls.append((method, list(request.job_ids), time.monotonic()))
                n = len(calls)
            if n == 1:
                raise RuntimeError("a bug of ours, or a broken channel")
            return pb.KeepAliveReply(job_ids=[7], inactive_limit_s=3.0)   # the controller's: renew every 0.5 s

    renewing = run._Renewing(Client(), 7)
    try:
        deadline = time.monotonic() + 10
        while len(calls) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        renewing.stop()
    assert len(calls) >= 4 and {(c[0], tuple(c[1])) for c in calls} == {("KeepAlive", (7,))}
    gaps = [b[2] - a[2] for a, b in zip(calls[2:], calls[3:])]
    assert all(0.4 < g < 2.0 for g in gaps), gaps


def test_sigkill_ends_the_grace_time_of_a_job_already_stopping(controller):
    # scancel -s KILL of a job in its grace time (cancelled, timed out, preempted): killed now, as Slurm's
    from air.airctld.errors import Conflict
    c, clock = controller
    job_id = _running(c, clock, allocation=False)
    delivered = []
    c._actions.submit = lambda fn, *args: fn(*args)
    c.clients.signal = lambda address, job, run, sig, grace, *rest: delivered.append((job, sig, grace))
    c.cancel(pb.JobFilter(job_ids=[job_id]), 0, ALICE)
    assert delivered == [(job_id, 0, c.config.controller.kill_wait_s)]
    assert c.cancel(pb.JobFilter(job_ids=[job_id]), signal.SIGKILL, ALICE) == [job_id]
    assert delivered[-1] == (job_id, 0, 0.0) and c.jobs.get(job_id).phase == JobPhase.COMPLETING
    job = c.jobs.get(job_id)
    c._commit([(job, events.exited(job, clock.now, 0, 9))], clock.now, 0)
    assert job_id not in c._no_grace   # (forgotten once it has ended)
    with pytest.raises(Conflict, match="cannot cancel it"):
        c.cancel(pb.JobFilter(job_ids=[job_id]), signal.SIGKILL, ALICE)


def test_a_job_stopping_to_be_requeued_is_cancelled_not_requeued(controller):
    # preempted (or asked to requeue): aircancel ends it CANCELLED once its run stops, leaving its grace
    # time be; -s KILL ends the grace time too. Either way it never comes back to the queue.
    c, clock = controller
    delivered = []
    c._actions.submit = lambda fn, *args: fn(*args)
    c.clients.signal = lambda address, job, run, sig, grace, *rest: delivered.append((job, sig, grace))
    for sig, resent in ((0, []), (signal.SIGKILL, [0.0])):
        job_id = _running(c, clock, allocation=False)
        job = c.jobs.get(job_id)
        c._commit([(job, events.stop(job, clock.now, JobResult.NONE, Reason.PREEMPTED, "preempted"))], clock.now, 0)
        delivered.clear()
        assert c.cancel(pb.JobFilter(job_ids=[job_id]), sig, ALICE) == [job_id]
        assert [g for j, s, g in delivered if j == job_id] == resent
        job = c.jobs.get(job_id)
        assert (job.phase, job.result, job.reason) == (JobPhase.COMPLETING, JobResult.CANCELLED, Reason.CANCELLED)
        c._commit([(job, events.finished(job, clock.now, 0, 15))], clock.now, 0)
        job = c.jobs.get(job_id)
        assert (job.phase, job.result, job.restart_count) == (JobPhase.DONE, JobResult.CANCELLED, 0)


def test_short_lulls_in_a_busy_controller_do_not_renew_the_excuse(controller):
    from air.airctld.controller import RPC_WORKERS, SATURATION_CREDIT
    c, clock = controller
    leased = _running(c, clock)
    busy = set(range(RPC_WORKERS))
    for _ in range(4 * SATURATION_CREDIT):   # busy, a short lull, busy again, ...
        c.rpcs_in_flight.update(busy)
        _wait(c, clock, LIMIT / 2, leased)
        c.rpcs_in_flight.clear()
        _wait(c, clock, 5, leased)
        if c.jobs.get(leased).phase != JobPhase.RUNNING:
            break
    assert c.jobs.get(leased).reason == Reason.INACTIVE_LIMIT
    assert clock.now - c.jobs.get(leased).start_time <= (SATURATION_CREDIT + 2) * LIMIT
