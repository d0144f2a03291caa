"""A batch script's start through its shepherd, with each shepherd (the C program and shepherd.py):
as its owner, its working directory, then its output files; what went wrong is said on the start-up
status pipe, and the script never runs."""
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
import tempfile
from pathlib import Path

import pytest

from air.airnoded import shepherding
from air.airnoded.shepherd import boot_id
from air.airnoded.shepherding import Child, Start

SCRIPT = "#!/bin/sh\necho out1 $1 $(pwd)\necho err1 >&2\necho out2\ntouch ran\n"


def _start(tmp_path, start: Start, uid=None, gid=None, script=None):
    """(exit status, what the start-up said) of SCRIPT (or `script`) started as `start` says, as uid
    (None: root)."""
    if script is None:
        script = tmp_path / "s.sh"
        script.write_text(SCRIPT)
        os.chmod(script, 0o755)
    folder = tmp_path / "run"
    folder.mkdir(mode=0o711, exist_ok=True)
    r, w = os.pipe()
    gid = os.getgid() if gid is None else gid
    try:
        herd = shepherding.spawn(folder, "batch", [Child([str(script), "arg"], {"PATH": "/usr/bin:/bin"}, w, w, start)],
                                 uid, gid, [gid], None)
    finally:
        os.close(w)
    herd.wait()
    with os.fdopen(r, "rb") as f:
        said = f.read().decode()
    # what a daemon that adopts it reads: the shepherd's own line first, then its events; nothing else left
    assert sorted(os.listdir(folder)) == ["batch.events", "batch.record"]
    lines = (folder / "batch.record").read_text().splitlines()
    assert lines[0].split()[:2] == ["shepherd", str(herd.pid)] and lines[0].split()[3] == boot_id()
    assert shepherding.tags(folder) == ["batch"] and shepherding._shepherd_of(folder, "batch") == \
        (herd.pid, herd.started, True)
    assert lines[1:] == [f"pid 0 {herd.pids[0]} {herd.starts[0]}", f"exit 0 {herd.exits[0]}"]
    os.unlink(folder / "batch.record")
    return herd.exits[0], said


def test_truncate_empties_then_appends_so_one_file_under_two_names_keeps_both_streams(tmp_path, shepherd_kind):
    out = tmp_path / "o.log"
    out.write_text("the last run's\n")
    work = tmp_path / "work"
    work.mkdir()
    status, said = _start(tmp_path, Start(str(work), str(out), str(tmp_path / "." / "o.log"), truncate=True))
    assert (status, said) == (0, "")
    assert sorted(out.read_text().splitlines()) == ["err1", f"out1 arg {work}", "out2"]
    assert (work / "ran").exists()   # (the script ran in its working directory)
    _start(tmp_path, Start(str(work), str(out), str(tmp_path / "." / "o.log")))
    assert sorted(out.read_text().splitlines()) == ["err1", "err1", f"out1 arg {work}", f"out1 arg {work}",
                                                    "out2", "out2"]


def test_relative_outputs_are_the_working_directorys_and_one_file_gets_both_streams(tmp_path, shepherd_kind):
    work = tmp_path / "work"
    work.mkdir()
    status, said = _start(tmp_path, Start(str(work), "job.out"))
    assert (status, said) == (0, "")
    assert (work / "job.out").read_text().splitlines() == [f"out1 arg {work}", "err1", "out2"]


def test_an_output_that_cannot_be_made_is_said_and_the_script_never_runs(tmp_path, shepherd_kind):
    work = tmp_path / "work"
    work.mkdir()
    status, said = _start(tmp_path, Start(str(work), str(tmp_path / "missing" / "o.log")))
    assert os.WEXITSTATUS(status) == 126 and not (work / "ran").exists()
    assert said.strip() == f"cannot create {tmp_path}/missing/o.log: No such file or directory"
    status, said = _start(tmp_path, Start(str(work), str(work / "o.log"), str(tmp_path / "missing" / "e.log")))
    assert os.WEXITSTATUS(status) == 126 and not (work / "ran").exists()
    assert said.strip() == f"cannot create {tmp_path}/missing/e.log: No such file or directory"


def test_a_working_directory_that_cannot_be_entered_is_said_and_the_script_never_runs(tmp_path, shepherd_kind):
    status, said = _start(tmp_path, Start(str(tmp_path / "gone"), "o.log"))
    assert os.WEXITSTATUS(status) == 126
    assert said.strip() == f"cannot enter the working directory {tmp_path}/gone: No such file or directory"


@pytest.mark.skipif(os.getuid() != 0, reason="starts the script as another user")
def test_the_owner_opens_the_outputs_with_its_own_rights_never_roots(shepherd_kind):
    nobody = pwd.getpwnam("nobody")
    tmp_path = Path(tempfile.mkdtemp(prefix="air-start-"))   # (pytest's folders are root's alone)
    os.chmod(tmp_path, 0o755)
    try:
        _as_nobody(tmp_path, nobody)
    finally:
        shutil.rmtree(tmp_path)


def _as_nobody(tmp_path, nobody):
    work = tmp_path / "work"
    work.mkdir(mode=0o777)
    os.chmod(work, 0o777)
    locked = tmp_path / "root-only"
    locked.mkdir(mode=0o755)
    status, said = _start(tmp_path, Start(str(work), str(locked / "o.log")), nobody.pw_uid, nobody.pw_gid)
    assert os.WEXITSTATUS(status) == 126 and said.strip() == f"cannot create {locked}/o.log: Permission denied"
    assert list(locked.iterdir()) == [] and not (work / "ran").exists()
    private = tmp_path / "root-only-work"
    private.mkdir(mode=0o700)
    status, said = _start(tmp_path, Start(str(private), str(work / "o.log")), nobody.pw_uid, nobody.pw_gid)
    assert os.WEXITSTATUS(status) == 126 and not (work / "ran").exists()
    assert said.strip() == f"cannot enter the working directory {private}: Permission denied"
    status, said = _start(tmp_path, Start(str(work), "o.log"), nobody.pw_uid, nobody.pw_gid)
    assert (status, said) == (0, "")
    made = os.stat(work / "o.log")
    assert (made.st_uid, made.st_gid) == (nobody.pw_uid, nobody.pw_gid) and not made.st_mode & stat.S_IWOTH
    assert os.stat(work / "ran").st_uid == nobody.pw_uid


def test_a_batch_shepherds_pipe_goes_with_its_daemon_and_the_next_one_follows_it_by_its_process(tmp_path,
                                                                                                shepherd_kind):
    """A batch script's shepherd sends its events through a pipe (no FIFO in the run's folder): a daemon
    that adopts it sees it running, and its end (a second at most after it) with the exit its record holds."""
    folder = tmp_path / "run"
    folder.mkdir(mode=0o711)
    r, w = os.pipe()
    herd = shepherding.spawn(folder, "batch", [Child(["/bin/sh", "-c", "sleep 1; exit 3"], {}, w, w)], None,
                             os.getgid(), [os.getgid()], None, named=False)
    os.close(w)
    os.close(r)
    assert sorted(os.listdir(folder)) == ["batch.record"]
    herd.close()   # the daemon that started it is gone (its read end of the pipe with it)
    adopted = shepherding.adopt(folder, "batch")
    assert not adopted.ended and adopted.alive() and adopted.running() == {0: herd.pids[0]}
    began = time.monotonic()
    adopted.wait()
    assert adopted.exits == {0: 3 << 8} and time.monotonic() - began < 2.5
    if herd.proc is not None:   # (the spawner reaps the shepherds it forked)
        herd.proc.wait()


def test_a_job_gets_every_signal_default_and_none_blocked(tmp_path, shepherd_kind):
    """Whatever the daemon and the shepherd ignore (SIGTERM aimed at the daemon, posix_spawn's own two
    signals in the C library's range), the job starts with default dispositions and an empty mask."""
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "sig.sh"
    script.write_text("#!/bin/sh\nexec grep -E '^Sig(Ign|Blk):' /proc/self/status\n")
    os.chmod(script, 0o755)
    folder = tmp_path / "run"
    folder.mkdir(mode=0o711)
    r, w = os.pipe()
    herd = shepherding.spawn(folder, "batch", [Child([str(script)], {"PATH": "/usr/bin:/bin"}, w, w,
                                                     Start(str(work), "o.log"))], None, os.getgid(), [os.getgid()],
                             None, named=False)
    os.close(w)
    os.close(r)
    herd.wait()
    assert herd.exits == {0: 0}
    assert (work / "o.log").read_text().split() == ["SigBlk:", "0" * 16, "SigIgn:", "0" * 16]


def test_a_batch_scripts_pwd_is_its_working_directory_not_the_submitters(tmp_path):
    from air.airnoded.launcher import Launcher
    from air.protos import air_pb2 as pb
    os.chmod(tmp_path, 0o755)
    spool, work = tmp_path / "spool", tmp_path / "work"
    spool.mkdir(mode=0o755)
    work.mkdir()
    exits = []
    launcher = Launcher("n1", spool, exits.append)
    code = "import os\nprint(os.environ['PWD'], os.getcwd())\n"
    launcher.launch(pb.Job(job_id=5, uid=os.getuid(), gid=os.getgid(), allocation=[pb.NodeAlloc(node="n1")],
                           request=pb.JobRequest(script=f"#!{sys.executable}\n{code}", workdir=str(work),
                                                 output=str(work / "out"), environment={"PWD": "/submitted/here"})))
    deadline = time.monotonic() + 30
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [e.exit_code for e in exits] == [0]
    assert (work / "out").read_text().split() == [str(work), str(work)]


def test_a_job_holds_no_descriptor_but_its_three(tmp_path, shepherd_kind):
    """Not the daemon's (one it let be inherited by mistake here), not the shepherd's (its events, its
    record, the status pipe)."""
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "fds.sh"
    script.write_text("#!/bin/sh\nexec ls /proc/self/fd\n")
    os.chmod(script, 0o755)
    leaked = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(leaked, True)
    try:
        status, said = _start(tmp_path, Start(str(work), "o.log"), script=script)
    finally:
        os.close(leaked)
    assert (status, said) == (0, "")
    assert (work / "o.log").read_text().split() == ["0", "1", "2", "3"]   # (3: the folder ls reads)


def test_a_batch_shepherd_followed_by_its_process_brings_what_it_records_later(tmp_path):
    """A daemon that adopted a batch shepherd just after it put its record in place (before the script's
    pid was in it) learns the pid from the record a second at most later: until then it could signal
    nothing of the run."""
    from air.airnoded.shepherd import start_time
    folder = tmp_path / "job3.0"
    folder.mkdir(mode=0o711)
    shepherd = subprocess.Popen(["sleep", "30"])   # (stands for the shepherd: alive, with its start time)
    script = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while not (start_time(shepherd.pid) and start_time(script.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        record = folder / "batch.record"
        record.write_text(f"shepherd {shepherd.pid} {start_time(shepherd.pid)} {boot_id()}\n")
        os.chmod(record, 0o600)
        herd = shepherding.adopt(folder, "batch")
        assert not herd.ended and herd.running() == {}
        with open(record, "a") as f:
            f.write(f"pid 0 {script.pid} {start_time(script.pid)}\n")
        assert herd.read(3) == [("pid", 0)] and herd.running() == {0: script.pid}
        herd.kill_children()
        assert script.wait(5) == -9
    finally:
        for proc in (shepherd, script):
            proc.kill()
            proc.wait()


def test_a_shepherd_that_cannot_write_its_record_starts_nothing(shepherd_kind):
    """A full disk under the run's folder: a record cut short would name no shepherd for a daemon that
    adopts the run (it would take the run as gone, and its job would run again elsewhere while this
    one ran on), so the shepherd starts nothing and leaves no record."""
    top = Path(tempfile.mkdtemp(prefix="air-full-"))
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "air-full", str(top)],
                      capture_output=True).returncode != 0:
        shutil.rmtree(top)
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        folder = top / "job4.0"
        folder.mkdir(mode=0o711)
        filler = os.open(top / "filler", os.O_WRONLY | os.O_CREAT)   # the disk full, to the last page
        try:
            while os.write(filler, b"x" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(filler)
        marker = Path(tempfile.mkdtemp(prefix="air-ran-")) / "ran"
        r, w = os.pipe()
        try:
            herd = shepherding.spawn(folder, "batch", [Child(["/bin/sh", "-c", f"touch {marker}"], {}, w, w)], None,
                                     os.getgid(), [os.getgid()], None, named=False)
        except OSError:
            herd = None   # (the Python spawner's answer can be lost with it)
        os.close(w)
        os.close(r)
        if herd is not None:
            herd.wait()
            assert herd.pids == {} and herd.exits == {}
        time.sleep(0.2)
        assert not marker.exists() and sorted(os.listdir(folder)) == []
        shutil.rmtree(marker.parent)
    finally:
        subprocess.run(["umount", str(top)], check=True)
        shutil.rmtree(top)
