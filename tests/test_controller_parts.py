"""The controller's parts (Launcher, NodeReports, SchedulingPass) work on the controller's own records,
never on copies: a copy would let one part miss what another changed (a node heard from, a job's fence
wait, a launch in flight)."""


def test_every_record_a_part_shares_with_the_controller_is_the_same_object(controller):
    c, _ = controller
    for part in (c.launcher, c.reports, c.passes):
        shared = [name for name, value in vars(part).items()
                  if hasattr(c, name) and not callable(value) and not isinstance(value, (bool, int, float))]
        assert len(shared) >= 6, (type(part).__name__, shared)
        for name in shared:
            assert getattr(part, name) is getattr(c, name), f"{type(part).__name__}.{name} is a copy"


def test_the_parts_read_the_same_lock_and_records_as_the_controller(controller):
    c, _ = controller
    assert c.reports._lock is c._lock and c.passes._lock is c._lock
    assert c.reports._misses is c._misses and c.reports._launching is c._launching is c.passes._launching
    assert c.reports.fence_wait is c.passes.fence_wait is c.fence_wait
    assert c.reports.suspect is c.passes.suspect is c.suspect
    assert c.passes._holds is c._holds and c.passes._preempted is c._preempted and c.passes._arrays is c._arrays
