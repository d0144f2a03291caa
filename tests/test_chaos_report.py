"""The chaos benchmark's accounting (bench/chaos_report.py) on timelines worked out by hand: which
steps count, ETTR, and what each fault cost, so that the figures it prints mean what they say."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from chaos_report import Fault, analyse, batch_mismatches, late_steps  # noqa: E402


def _steps(first_time: float, first_step: int, count: int) -> list[tuple[float, int]]:
    return [(first_time + i, first_step + i) for i in range(count)]


def test_a_requeue_costs_its_downtime_and_the_work_since_the_checkpoint():
    # run 0: starts at 100, restored at 105, steps 1-10 end at 106..115 (1 s each); the fault at
    # 115.5; requeued at 116, run 1 starts at 118, restored from step 5 at 123, steps 6-20 end at
    # 124..138; the job completes at 139
    steps = {0: _steps(106, 1, 10), 1: _steps(124, 6, 15)}
    restored = {0: (105.0, 0), 1: (123.0, 5)}
    events = [(99.0, "", "PENDING", "NONE", "submitted"), (100.0, "PENDING", "RUNNING", "NONE", ""),
              (116.0, "RUNNING", "PENDING", "NodeFail", "node02 lost"), (118.0, "PENDING", "RUNNING", "NONE", ""),
              (139.0, "RUNNING", "COMPLETED", "NONE", "")]
    ranks = {0: 101.0, 1: 120.0}                  # run 1's ranks started 2 s after the run
    faults = [Fault("ctld", 108.5, run=0), Fault("kill", 115.5, "node02", run=0)]   # run 0 carries on after the first
    a = analyse(steps, restored, events, faults, total_steps=20, ranks=ranks)
    assert (a.start, a.end, a.runs, a.missing) == (100.0, 139.0, 2, [])
    assert a.useful == pytest.approx(20)          # steps 1-5 of run 0 and 6-20 of run 1
    assert a.ettr == pytest.approx(20 / 39)
    carried, o = a.outcomes
    assert not carried.requeued and carried.cost == 0 and carried.work_lost == 0   # steps 6-10 are the kill's
    assert o.requeued and o.reason == "NodeFail: node02 lost"
    assert (o.detect, o.wait, o.launch, o.restart, o.first, o.resume) == pytest.approx((0.5, 2, 2, 3, 1, 8.5))
    assert (o.redone, o.work_lost) == (5, pytest.approx(5))
    assert o.cost == pytest.approx(8 + 5)         # 115 -> 123 without a step, and steps 6-10 of run 0
    assert (a.startup, a.tail) == pytest.approx((5, 1))
    assert a.other == pytest.approx(0)            # every second of the wall time is accounted for


def test_a_run_that_trains_on_after_the_fault_loses_those_steps_too():
    # SIGSTOP of a daemon: run 0 trains on for 3 s after the fault until its node fences it
    steps = {0: _steps(1, 1, 13), 1: _steps(30, 11, 10)}
    events = [(0.0, "PENDING", "RUNNING", "NONE", ""), (20.0, "RUNNING", "PENDING", "NodeFail", ""),
              (22.0, "PENDING", "RUNNING", "NONE", ""), (40.0, "RUNNING", "COMPLETED", "NONE", "")]
    a = analyse(steps, {0: (0.0, 0), 1: (29.0, 10)}, events, [Fault("stop", 10.0, "node01", run=0)], 20)
    (o,) = a.outcomes
    assert o.redone == 3 and o.work_lost == pytest.approx(0)   # steps 11-13 came after the fault
    assert o.cost == pytest.approx(29 - 10)                    # the window: nothing in it counts
    assert a.useful == pytest.approx(20) and a.other == pytest.approx(0)


def test_a_fault_the_run_carries_on_through_costs_nothing_and_a_missing_step_is_reported():
    steps = {0: [(1.0, 1), (2.0, 2), (9.0, 3), (10.0, 5)]}       # a 7 s stall; step 4 never logged
    events = [(0.0, "PENDING", "RUNNING", "NONE", ""), (11.0, "RUNNING", "COMPLETED", "NONE", "")]
    a = analyse(steps, {0: (0.0, 0)}, events, [Fault("ctld", 2.5, run=0)], 5)
    (o,) = a.outcomes
    assert not o.requeued and o.resume == pytest.approx(6.5) and o.cost == pytest.approx(0)
    assert a.missing == [4] and a.ettr == pytest.approx(10 / 11)


def test_batches_that_differ_from_the_reference():
    assert batch_mismatches({1: "a", 2: "b", 3: "x"}, {1: "a", 2: "b", 3: "c", 4: "d"}) == [3, 4]


def test_an_older_run_that_logs_after_a_newer_one_started_is_caught():
    assert late_steps({0: _steps(1, 1, 10), 1: _steps(20, 6, 5)}) == []
    assert late_steps({0: _steps(1, 1, 10), 1: _steps(8, 6, 5)}) == [(0, 9, 1), (0, 10, 1)]
