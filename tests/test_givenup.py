"""The record of runs given up, kept in the spool across node daemon restarts."""
import os

from air.airnoded import givenup
from air.airnoded.givenup import GivenUp


def test_runs_given_up_are_kept_for_the_next_daemon_and_forgotten_once_their_groups_go(tmp_path):
    first = GivenUp(tmp_path)
    first.add((7, 0))
    first.add((9, 2))
    first.add((7, 0))
    again = GivenUp(tmp_path)                  # a daemon started again
    assert (7, 0) in again and (9, 2) in again and (7, 1) not in again
    again.discard((7, 0))                      # its group emptied and went
    again.keep_only({(9, 2), (11, 0)})         # what a starting daemon still finds
    assert (tmp_path / givenup.FILE).read_text() == "9 2\n"
    assert os.stat(tmp_path / givenup.FILE).st_mode & 0o777 == 0o600


def test_a_record_that_is_not_a_plain_file_of_roots_is_not_read(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("5 0\n")
    (tmp_path / givenup.FILE).symlink_to(target)
    assert (5, 0) not in GivenUp(tmp_path)     # a link is never followed: the groups are watched anew
    (tmp_path / givenup.FILE).unlink()
    (tmp_path / givenup.FILE).write_bytes(b"\xff\xfe 1\n5 0\nx y\n-1 2\n")
    assert (5, 0) not in GivenUp(tmp_path)     # not ASCII: nothing of it is trusted


def test_lines_that_are_no_run_are_skipped_and_the_record_is_bounded(tmp_path):
    (tmp_path / givenup.FILE).write_text("5 0\nx y\n-1 2\n6\n\n")
    record = GivenUp(tmp_path)
    assert (5, 0) in record
    for i in range(givenup.MAX_KEPT + 10):
        record.add((100 + i, 0))
    assert len(GivenUp(tmp_path)._runs) == givenup.MAX_KEPT
