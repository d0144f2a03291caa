"""A shepherd's records in a run's folder name processes by pid and start time, which mean something
only in the boot that wrote them. The spool outlives a reboot; the processes do not. A daemon (or
the fence keeper) that reads a record from before a reboot must never signal what now runs under
those numbers, and still reports the exits the record holds."""
import os
import signal
import subprocess
import time

import pytest

from air.airnoded import shepherding
from air.airnoded.shepherd import boot_id, start_time


@pytest.fixture
def bystander():
    """A process group of someone else's that happens to have the numbers a record names."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    for _ in range(100):
        if start_time(proc.pid):
            break
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(params=["record", "file"])
def layout(request):
    """Where the shepherd's own line is: the record's first line, or (shepherds of earlier versions,
    whose runs a daemon adopts after an upgrade) a TAG.shepherd file of its own."""
    return request.param


def _records(folder, tag, shepherd_boot, pgid, started, ended=(), layout="record"):
    folder.mkdir(mode=0o711, exist_ok=True)
    own = f"{os.getpid()} {start_time(os.getpid())} {shepherd_boot}"
    lines = [f"pid 0 {pgid} {started}", f"pid 1 {pgid} {started}"] + [f"exit {i} 256" for i in ended]
    if layout == "record":
        lines.insert(0, f"shepherd {own}")
    else:
        (folder / f"{tag}.shepherd").write_text(own + "\n")
        os.chmod(folder / f"{tag}.shepherd", 0o600)
    (folder / f"{tag}.record").write_text("\n".join(lines) + "\n")
    os.chmod(folder / f"{tag}.record", 0o600)


def test_a_record_from_before_a_reboot_names_nothing_that_runs(tmp_path, bystander, layout):
    folder = tmp_path / "job7.0"
    _records(folder, "step0-ab", "another-boot", bystander.pid, start_time(bystander.pid), ended=[1], layout=layout)
    assert shepherding.tags(folder) == ["step0-ab"]
    assert shepherding.live_groups(folder) == []          # the fence keeper kills nothing
    herd = shepherding.adopt(folder, "step0-ab")
    assert herd.ended and not herd.alive() and herd.running() == {}
    assert herd.exits == {1: 256}                          # an exit recorded before the reboot still counts
    herd.kill_children()
    time.sleep(0.2)
    assert bystander.poll() is None, "a process of another boot's numbers was killed"


def test_the_same_record_from_this_boot_is_followed(tmp_path, bystander, layout):
    """The control: with this boot's id the very same record names the live group (so the test above
    shows the boot id at work, not some other check)."""
    folder = tmp_path / "job7.0"
    _records(folder, "step0-ab", boot_id(), bystander.pid, start_time(bystander.pid), layout=layout)
    assert shepherding.tags(folder) == ["step0-ab"]
    assert shepherding.live_groups(folder) == [bystander.pid, bystander.pid]
    herd = shepherding.adopt(folder, "step0-ab")
    herd.kill_children(signal.SIGKILL)
    assert bystander.wait(timeout=5) == -signal.SIGKILL


def test_a_record_whose_shepherd_line_was_cut_short_names_nothing_that_runs(tmp_path, bystander, layout):
    """The shepherd's line is written whole and synced before anything starts: one that is empty or
    cut short is from a boot that lost power, and its numbers are someone else's now."""
    folder = tmp_path / "job7.0"
    _records(folder, "batch", boot_id(), bystander.pid, start_time(bystander.pid), layout=layout)
    if layout == "record":
        (folder / "batch.record").write_text(f"shepherd {os.getpid()}")
    else:
        (folder / "batch.shepherd").write_text("")
    assert shepherding.live_groups(folder) == []
    shepherding.adopt(folder, "batch").kill_children()
    time.sleep(0.2)
    assert bystander.poll() is None
