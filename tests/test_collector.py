"""The garbage collector is paused while many jobs change at once, and always runs again after."""
import gc
import threading

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


def test_a_collector_turned_off_by_the_operator_stays_off():
    gc.disable()
    with collector.paused(collector.BULK):
        pass
    assert not gc.isenabled()
