"""The garbage collector is paused while many jobs change at once, and always runs again after."""
import gc
import threading
import time

import pytest

from air.airctld import collector


@pytest.fixture(autouse=True)
def collector_on():
    gc.enable()
    yield
    gc.enable()


def test_a_small_change_never_pauses_it():
    with collector.paused(collector.BULK - 1):
        assert gc.isenabled()


def test_a_bulk_change_pauses_it_until_the_last_one_ends():
    second, go_on = threading.Event(), threading.Event()

    def other():
        with collector.paused(collector.BULK):
            second.set()
            go_on.wait(5)

    with collector.paused(collector.BULK):
        assert not gc.isenabled()
        t = threading.Thread(target=other)
        t.start()
        assert second.wait(5)
    assert not gc.isenabled()   # the other change is still under way
    go_on.set()
    t.join(5)
    assert gc.isenabled()


def test_it_runs_again_after_a_change_that_failed():
    with pytest.raises(RuntimeError):
        with collector.paused(collector.BULK):
            raise RuntimeError("store failed")
    assert gc.isenabled()


class _Cycle:
    def __init__(self):
        self.me = self


def test_what_a_pause_made_is_old_after_it_and_a_cycle_of_it_is_still_freed():
    import weakref
    with collector.paused(collector.BULK):
        made = [[i] for i in range(50_000)]
        cycle = weakref.ref(_Cycle())   # garbage, in a cycle only the collector frees
        assert gc.get_count()[0] >= 50_000   # all of it young, while paused
    young = {id(o) for o in gc.get_objects(generation=0)} | {id(o) for o in gc.get_objects(generation=1)}
    assert not young & {id(o) for o in made[::1000]}
    assert gc.get_count()[0] < 1000   # no young collection owed for them
    assert cycle() is not None
    assert not collector.settle(time.monotonic())                        # not yet: right after the change
    assert collector.settle(time.monotonic() + collector.SETTLE_S)      # its full collection, later
    assert cycle() is None
    assert not collector.settle(time.monotonic() + 2 * collector.SETTLE_S)   # once


def test_a_collector_turned_off_by_the_operator_stays_off():
    gc.disable()
    with collector.paused(collector.BULK):
        pass
    assert not gc.isenabled()


def test_a_cancel_or_hold_of_many_jobs_runs_paused_and_leaves_the_collector_running(controller):
    from air.protos import air_pb2 as pb
    from air.protos.credential import Identity
    c, _ = controller
    root = Identity(0, 0)
    req = pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True)
    for _ in range(collector.BULK):
        c.submit(req, root)
    seen = []
    write = c.store.update_jobs

    def watched(changes, now, who, alike=None):
        seen.append((len(changes), gc.isenabled()))
        write(changes, now, who, alike)

    c.store.update_jobs = watched
    c.hold(pb.JobFilter(), False, root)          # released: BULK jobs at once
    c.cancel(pb.JobFilter(), 0, root)
    assert seen == [(collector.BULK, False), (collector.BULK, False)] and gc.isenabled()
