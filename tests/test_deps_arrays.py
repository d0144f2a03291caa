"""Dependencies and arrays, pure: parsing, judging against job states, compact task lists."""
import pytest

from air.airctld import deps
from air.protos import arrays
from air.airctld.deps import DepState
from air.protos.states import JobPhase, JobResult

DONE_OK = (JobPhase.DONE, JobResult.COMPLETED)
DONE_BAD = (JobPhase.DONE, JobResult.FAILED)
RUNNING = (JobPhase.RUNNING, JobResult.NONE)
PENDING = (JobPhase.PENDING, JobResult.NONE)


def _judge(text, states, singleton_free=True):
    return deps.evaluate(deps.parse(text), lambda i: states[i], singleton_free)


@pytest.mark.parametrize("text, states, expected", [
    ("afterok:1", {1: [DONE_OK]}, DepState.SATISFIED),
    ("afterok:1", {1: [RUNNING]}, DepState.WAITING),
    ("afterok:1", {1: [DONE_BAD]}, DepState.NEVER),
    ("afterok:1:2", {1: [DONE_OK], 2: [RUNNING]}, DepState.WAITING),
    ("afternotok:1", {1: [DONE_BAD]}, DepState.SATISFIED),
    ("afternotok:1", {1: [DONE_OK]}, DepState.NEVER),
    ("afterany:1", {1: [DONE_BAD]}, DepState.SATISFIED),
    ("after:1", {1: [RUNNING]}, DepState.SATISFIED),
    ("after:1", {1: [PENDING]}, DepState.WAITING),
    ("afterok:1,afterany:2", {1: [DONE_OK], 2: [RUNNING]}, DepState.WAITING),
    ("afterok:1,afterany:2", {1: [DONE_BAD], 2: [RUNNING]}, DepState.NEVER),
    ("afterok:1?afternotok:1", {1: [DONE_BAD]}, DepState.SATISFIED),
    ("afterok:1?afterok:2", {1: [DONE_BAD], 2: [DONE_BAD]}, DepState.NEVER),
    ("afterok:1?afterok:2", {1: [DONE_BAD], 2: [RUNNING]}, DepState.WAITING),
    ("afterok:7", {7: [DONE_OK, DONE_OK, RUNNING]}, DepState.WAITING),     # an array: every task
    ("afterok:7", {7: [DONE_OK, DONE_BAD]}, DepState.NEVER),
])
def test_dependency_states(text, states, expected):
    assert _judge(text, states) == expected


def test_singleton_waits_while_another_of_the_name_runs():
    assert _judge("singleton", {}, singleton_free=False) == DepState.WAITING
    assert _judge("singleton", {}, singleton_free=True) == DepState.SATISFIED


@pytest.mark.parametrize("text, message", [
    ("afterwards:1", "must be one of"),
    ("afterok:", "give job ids"),
    ("afterok:x", "give job ids"),
    ("afterok:1,afterok:2?afterok:3", "mixes"),
    ("singleton:3", "takes no job ids"),
])
def test_bad_dependencies_say_why(text, message):
    with pytest.raises(ValueError, match=message):
        deps.parse(text)


def test_array_specs():
    assert arrays.parse("0-4") == ([0, 1, 2, 3, 4], 0)
    assert arrays.parse("1,5,9") == ([1, 5, 9], 0)
    assert arrays.parse("0-12:4%2") == ([0, 4, 8, 12], 2)
    assert arrays.parse("3,1-2") == ([1, 2, 3], 0)
    for bad, message in [("5-1", "empty range"), ("a-b", "is not N"), ("0-3%0", "at least 1"),
                         ("0-200000", "indices go up to"), ("0-99999", "at most 10000 tasks")]:
        with pytest.raises(ValueError, match=message):
            arrays.parse(bad)


def test_compact_task_lists():
    assert arrays.compact([1, 2, 3, 5, 7, 8, 9]) == "1-3,5,7-9"
    assert arrays.compact([4]) == "4"
    assert arrays.compact([]) == ""


def test_texts_admission_took_before_read_the_same_when_read_again():
    """A pending job's dependency is read again at every pass and an array's spec at every launch, from
    the text admission took (digits int() reads, such as "٤٢" or padded ones): they read as before, or
    after an upgrade one stored job would stop every pass."""
    assert deps.parse("afterok:٤٢:0000000000000000000042").terms[0].job_ids == (42, 42)
    assert deps.parse("afterok:" + "0" * 4100 + "42").terms[0].job_ids == (42,)   # (int() reads 4,300 digits)
    assert arrays.parse("٣-٥%٢") == arrays.parse("3-5%2")
    for never_taken in ("afterok:²", "afterok:" + "9" * 25, "afterok:" + "1" * 5000):   # (int() or the store
        with pytest.raises(ValueError, match="give job ids"):                             # refused them then too)
            deps.parse(never_taken)
