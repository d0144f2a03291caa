"""What airrun makes of a step's ends (aircli.run._Verdict), against the rules written out: the first
failed rank's code; a node given up is NODE_LOST (the job goes back to the queue); and a rank that fails
while another node's stream is broken is held until that node comes back (its failure stands) or is given
up (the node's loss is the cause: NODE_LOST)."""
from air.aircli.run import _Verdict
from air.protos.states import ExitCode

PATIENCE = 7.5


def test_a_failure_while_every_node_answers_is_the_steps_at_once():
    v = _Verdict(PATIENCE)
    assert v.rank_exited(0, 0, 0, 0, False, False, 0.0) is False   # a clean exit
    assert v.rank_exited(1, 3, 3, 0, False, False, 1.0) is True
    assert (v.first_bad, v.outcome) == (3, (3, 0))
    assert v.rank_exited(2, 9, 9, 0, False, False, 2.0) is False   # only the first counts
    assert (v.first_bad, v.outcome) == (3, (3, 0))


def test_a_failure_while_a_node_is_away_then_lost_is_the_nodes_loss():
    # a host dies: its stream breaks, a rank elsewhere loses its collective's peer and exits 1
    v = _Verdict(PATIENCE)
    assert v.rank_exited(1, 1, 1, 0, False, True, 10.0) is False   # held: a node's stream is broken
    assert v.settle(True, 12.0) is False and v.first_bad == 0       # still away, still held
    v.node_lost()                                                   # given up after its patience
    assert v.first_bad == ExitCode.NODE_LOST and v.outcome == (0, 0)
    assert v.settle(False, 20.0) is False and v.first_bad == ExitCode.NODE_LOST


def test_a_failure_while_a_node_is_away_stands_once_it_is_back_or_its_time_is_up():
    v = _Verdict(PATIENCE)
    v.rank_exited(1, 137, 0, 9, False, True, 10.0)   # killed by SIGKILL (128 + 9)
    assert v.settle(False, 11.0) is True              # its daemon is back (restarted): the failure stands
    assert (v.first_bad, v.outcome) == (137, (0, 9))
    v = _Verdict(PATIENCE)
    v.rank_exited(1, 4, 4, 0, False, True, 10.0)
    assert v.settle(True, 10.0 + PATIENCE) is False                  # (within patience and a second)
    assert v.settle(True, 10.0 + PATIENCE + 1.0) is True and v.first_bad == 4
    v.node_lost()                                                    # a loss after it: the first stands
    assert v.first_bad == 4


def test_a_rank_stopped_for_requeue_or_by_its_nodes_fence_is_no_failure():
    v = _Verdict(PATIENCE)
    assert v.rank_exited(0, ExitCode.REQUEUE, ExitCode.REQUEUE, 0, False, True, 0.0) is False
    assert v.first_bad == ExitCode.REQUEUE and v.held is None
    v = _Verdict(PATIENCE)
    assert v.rank_exited(0, 137, 0, 9, True, False, 0.0) is False   # fenced: its node lost the controller
    assert v.first_bad == ExitCode.NODE_LOST


def test_a_rank_stopped_by_its_nodes_fence_is_the_nodes_loss_unless_the_step_had_a_code_before():
    v = _Verdict(PATIENCE)
    assert v.fenced_loss(143, True)
    assert not v.fenced_loss(143, False) and not v.fenced_loss(0, True) and not v.fenced_loss(ExitCode.REQUEUE, True)
    assert v.rank_exited(0, 143, 0, 15, True, False, 1.0) is False   # its node lost the controller: not a failure
    assert v.first_bad == ExitCode.NODE_LOST
    assert v.fenced_loss(137, True)                                  # another node's fence: the same loss
    for first in (3, ExitCode.REQUEUE):   # a rank failed, or stopped for requeue, before: that code stands
        v = _Verdict(PATIENCE)
        v.rank_exited(0, first, first, 0, False, False, 1.0)
        assert not v.fenced_loss(143, True)
        v.rank_exited(1, 143, 0, 15, True, False, 2.0)
        assert v.first_bad == first
