"""Health signals: every signal the node daemon makes reads back as its kind, the texts stored by
earlier versions read the same, and only conditions that can pass return a node by themselves."""
from air.protos import signals
from air.protos.signals import HealthKind as K

# (signal as made, its text, its kind, clears by itself, its metric label): written out by hand
MADE = [
    (signals.xid(79), "XID 79", K.XID, False, "xid"),
    (signals.ECC_DBE, "ECC DBE", K.ECC, False, "ecc"),
    (signals.nvlink_down(3), "NVLink 3 down", K.NVLINK, False, "nvlink"),
    (signals.ROW_REMAP_FAILURE, "row remap failure", K.ROW_REMAP, False, "row_remap"),
    (signals.ib_port("mlx5_0/1", "1: DOWN"), "IB mlx5_0/1 DOWN", K.IB_PORT, True, "ib"),
    (signals.ib_port("mlx5_0/1", "2: INIT"), "IB mlx5_0/1 INIT", K.IB_PORT, True, "ib"),
    (signals.ib_errors("mlx5_0/1"), "IB mlx5_0/1 errors", K.IB_ERRORS, False, "ib"),
    (signals.ib_flapping("mlx5_0/1"), "IB mlx5_0/1 flapping", K.IB_FLAPPING, False, "ib"),
    (signals.THERMAL, "thermal", K.THERMAL, True, "thermal"),
    (signals.HEALTH_PROGRAM, "health program", K.HEALTH_PROGRAM, True, "health_program"),
    (signals.FENCED, "fenced", K.FENCED, False, "fenced"),
    (signals.KILL_TASK_FAILED, "Kill task failed", K.KILL_TASK_FAILED, False, "kill_task_failed"),
    (signals.ADMIN, "admin", K.ADMIN, False, "admin"),
    (signals.RESUMED, "resumed", K.RESUMED, False, "resumed"),
]


def test_every_signal_reads_back_as_its_kind():
    for made, text, kind, clears, label in MADE:
        assert made == text   # the texts people (and stores of earlier versions) have
        assert signals.kind_of(text) == kind, text
        assert kind.clears_by_itself == clears and kind.label == label, text
    assert {kind for _, _, kind, _, _ in MADE} == set(K) - {K.OTHER}


def test_only_a_run_that_will_not_die_drains_its_node_without_ending_the_jobs_there():
    assert [kind for kind in K if not kind.ends_jobs] == [K.KILL_TASK_FAILED]


def test_odd_texts_are_other_and_sysfs_names_never_change_a_kind():
    for text in ("", "XID", "XID x", "IB", "IB  DOWN", "nvlink 3 down", "NVLink 3 up", "thermal ", "something"):
        assert signals.kind_of(text) == K.OTHER, text
    # a port or state name as sysfs gives it, spaces and newlines included, is one word of the signal
    assert signals.kind_of(signals.ib_port("mlx5 0/1 flapping", "4: ACTIVE DEFER\n")) == K.IB_PORT
    assert signals.kind_of(signals.ib_port("x", "")) == K.IB_PORT
    assert signals.kind_of(signals.ib_errors("a b")) == K.IB_ERRORS


def test_texts_of_earlier_daemons_keep_their_kind():
    # a port state with spaces (an unreadable state file) was sent as is: still a port, which clears
    assert signals.kind_of("IB mlx5_0/1 unreadable (No such file or directory)") == K.IB_PORT
    assert signals.ib_port("mlx5_0/1", "unreadable (No such file)") == "IB mlx5_0/1 unreadable_(No_such_file)"
    assert signals.ib_port("mlx5 0/1", "1: DOWN") != signals.ib_port("mlx50/1", "1: DOWN")
