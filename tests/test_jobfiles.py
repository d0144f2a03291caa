"""The node daemon's handling of files a job controls, against a small model of what must hold: root
reads only regular files of the job's owner, within the limit, never through a link, and removes
any tree a job makes without crashing or leaving the spool. Runs as root, as the daemon does."""
import os
import pwd
import re
import shutil
import subprocess
import stat
import tempfile
import time
from pathlib import Path

import pytest

from air.airnoded import jobfiles, progress
from air.airnoded.jobfiles import UnsafeFile

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the node daemon's file handling is root's")


@pytest.fixture
def spool():
    top = Path(tempfile.mkdtemp(prefix="air-spool-", dir="/tmp"))   # a job (nobody) can reach it
    os.chmod(top, 0o755)
    path = top / "spool"
    path.mkdir(mode=0o755)
    yield path
    subprocess.run(["rm", "-rf", str(top)], check=False)   # iterative, whatever a test left


@pytest.fixture
def user():
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


def _as_user(uid, gid, fn):
    """Run fn in a child process as uid:gid (what a job would do)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            fn()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_reports_are_read_only_from_regular_files_of_the_owner(spool, user, tmp_path):
    uid, gid = user
    folder = progress.prepare(spool, 7, 0, uid, gid)
    secret = tmp_path / "secret"
    secret.write_text('{"step": 99}')
    os.chmod(secret, 0o600)

    def plant():
        (folder / "rank0.json").write_text('{"step": 1}')
        os.symlink(secret, folder / "rank1.json")
        os.mkfifo(folder / "rank2.json")
        (folder / "rank3.json").write_bytes(b"x" * 100)
    _as_user(uid, gid, plant)
    os.link(secret, folder / "rank4.json")    # root's file, hard-linked in (the kernel may let a job do it)
    with jobfiles.OwnerDir(folder) as d:
        assert d.read("rank0.json", 64) == b'{"step": 1}'
        for name, why in (("rank1.json", "is a symbolic link"), ("rank2.json", "is a FIFO"),
                          ("rank3.json", "is 100 bytes; the limit is 64"),
                          ("rank4.json", f"belongs to uid 0, not to the job's owner (uid {uid})")):
            with pytest.raises(UnsafeFile, match=re.escape(why)):
                d.read(name, 64)
    assert secret.read_text() == '{"step": 99}'


@pytest.mark.parametrize("swap", ["symlink", "hardlink"])
def test_a_file_swapped_between_the_check_and_the_open_is_refused(spool, user, monkeypatch, swap):
    """The job wins the race right after the lstat: rank0.json becomes a link to another file of
    the owner's (which passes every ownership check): only O_NOFOLLOW, or the inode compare, stop it."""
    uid, gid = user
    folder = progress.prepare(spool, 8, 0, uid, gid)

    def write():
        (folder / "rank0.json").write_text('{"step": 1}')
        (folder / "other.json").write_text('{"step": 2}')
    _as_user(uid, gid, write)
    real_stat = jobfiles.lstat_beneath

    def stat_then_swap(dir_fd, name):
        result = real_stat(dir_fd, name)
        if name == "rank0.json":
            os.unlink(folder / "rank0.json")
            (os.symlink if swap == "symlink" else os.link)(folder / "other.json", folder / "rank0.json")
        return result
    monkeypatch.setattr(jobfiles, "lstat_beneath", stat_then_swap)
    with jobfiles.OwnerDir(folder) as d, pytest.raises(UnsafeFile):
        d.read("rank0.json", 4096)


def test_a_progress_folder_on_another_filesystem_is_refused(spool, user):
    uid, gid = user
    folder = progress.prepare(spool, 12, 0, uid, gid)
    with pytest.raises(UnsafeFile, match="on another filesystem"):
        jobfiles.OwnerDir(folder, device=os.stat(spool).st_dev + 1)


def test_any_tree_a_job_makes_is_removed_without_recursion(spool, user):
    uid, gid = user
    folder = progress.prepare(spool, 9, 3, uid, gid)

    def deep():
        os.symlink("/etc", folder / "etc-link")
        os.chdir(folder)
        for i in range(3000):   # deeper than Python's recursion limit, and than PATH_MAX
            os.mkdir("d")
            os.chdir("d")
        for i in range(50):
            with open(f"f{i}", "w") as f:
                f.write("x")
    _as_user(uid, gid, deep)
    jobfiles.remove_job_dir(spool, 9, 3)
    assert not jobfiles.job_dir(spool, 9, 3).exists()
    _emptied(spool)
    assert os.path.isdir("/etc") and os.listdir("/etc")


def _emptied(spool, timeout=60.0):
    deadline = time.monotonic() + timeout
    while os.listdir(spool / jobfiles.TRASH):
        assert time.monotonic() < deadline, "the janitor did not empty the trash"
        time.sleep(0.05)


def test_a_tree_over_the_budget_is_emptied_a_slice_at_a_time(spool, user, monkeypatch):
    uid, gid = user
    folder = progress.prepare(spool, 10, 0, uid, gid)
    _as_user(uid, gid, lambda: [os.mkdir(folder / f"d{i}") for i in range(300)])
    monkeypatch.setattr(jobfiles, "REMOVE_BUDGET", 50)   # the janitor's slices: 50 entries each
    slices, empty = [], jobfiles.empty_trash
    monkeypatch.setattr(jobfiles, "empty_trash", lambda *a, **k: slices.append(1) or empty(*a, **k))
    jobfiles.remove_job_dir(spool, 10, 0)
    assert not jobfiles.job_dir(spool, 10, 0).exists()     # out of the way at once
    _emptied(spool)
    assert len(slices) >= 300 // 50   # (301 entries, 50 at a time)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_what_cannot_be_removed_is_tried_again_later_not_at_once(spool, user, caplog):
    # a job mounts something in its folder (FUSE, as its owner): moving it fails until it is unmounted;
    # the janitor says so once and goes on, it does not retry it (and log it) over and over
    import logging
    uid, gid = user
    folder = progress.prepare(spool, 13, 0, uid, gid)
    (folder / "m").mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "none", str(folder / "m")], capture_output=True).returncode:
        pytest.skip("tmpfs cannot be mounted here")
    caplog.set_level(logging.WARNING, logger="airnoded")
    try:
        jobfiles.remove_job_dir(spool, 13, 0)
        for _ in range(3):   # more wake-ups (other jobs' ends): the stuck one stays skipped until its retry
            time.sleep(0.3)
            jobfiles.clean_trash_soon(spool)
        time.sleep(0.5)
        said = [r for r in caplog.records if "cannot be removed now" in r.getMessage()]
        assert len(said) == 1
    finally:
        mounted = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout
        for target in mounted.split():
            if target.startswith(str(spool)):
                subprocess.run(["umount", target])
    jobfiles.clean_trash_soon(spool)   # (at its next retry it goes)


def test_removing_a_run_folder_never_waits_for_what_the_job_left_in_it(spool, user):
    # the heartbeat thread removes finished runs' folders: a deep tree there must cost it nothing
    # (emptying 40,000 levels took about 6 s; a late heartbeat fences the node and stops every job)
    uid, gid = user
    folder = progress.prepare(spool, 11, 0, uid, gid)

    def deep():
        os.chdir(folder)
        for _ in range(10_000):
            os.mkdir("d")
            os.chdir("d")
    _as_user(uid, gid, deep)
    began = time.monotonic()
    jobfiles.remove_job_dir(spool, 11, 0)
    assert time.monotonic() - began < 0.2
    assert not jobfiles.job_dir(spool, 11, 0).exists()
    _emptied(spool)


def test_run_folders_are_roots_and_the_progress_folder_the_owners(spool, user):
    uid, gid = user
    folder = progress.prepare(spool, 11, 2, uid, gid)
    base = jobfiles.job_dir(spool, 11, 2)
    assert base.name == "job11.2" and jobfiles.parse_job_dir(base.name) == (11, 2)
    st = os.lstat(base)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o711)
    st = os.lstat(folder)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (uid, gid, 0o700)
    progress.write_stop_reason(spool, 11, 2, "Preempted")
    st = os.lstat(base / progress.STOP_REASON)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, gid, 0o640)
    assert (base / progress.STOP_REASON).read_text() == "Preempted\n"


def test_a_spool_other_users_could_move_or_write_is_refused(spool):
    tmp_path = spool.parent
    jobfiles.check_spool(spool)
    os.chmod(spool, 0o777)
    with pytest.raises(OSError, match="may be written by other users"):
        jobfiles.check_spool(spool)
    os.chmod(spool, 0o755)
    os.chmod(tmp_path, 0o777)   # a parent anyone may write (no sticky bit): the spool could be swapped
    with pytest.raises(OSError, match="above the spool, may be written by other users"):
        jobfiles.check_spool(spool)
    os.chmod(tmp_path, 0o1777)  # sticky, like /tmp: others cannot move what is root's
    jobfiles.check_spool(spool)


def test_one_bad_job_never_keeps_the_others_reports_from_the_heartbeat(spool, user):
    uid, gid = user
    good = progress.prepare(spool, 1, 0, uid, gid)
    bad = progress.prepare(spool, 2, 0, uid, gid)

    def write():
        (good / "rank0.json").write_text('{"step": 5}')
        os.mkfifo(bad / "rank0.json")
    _as_user(uid, gid, write)
    reader = progress.ProgressReader(spool)
    got = {p.job_id: p for p in reader.collect(1e10, [(2, 0), (1, 0), (3, 0)])}
    assert got[1].report == '{"step": 5}' and got[1].run == 0
    assert 2 not in got or got[2].report == ""


def test_reports_in_one_heartbeat_are_bounded_in_all(spool, user, monkeypatch):
    uid, gid = user
    monkeypatch.setattr(progress, "MAX_BEAT_BYTES", 1000)
    keys = []
    for job in range(1, 6):
        folder = progress.prepare(spool, job, 0, uid, gid)
        _as_user(uid, gid, lambda f=folder: (f / "rank0.json").write_text('{"pad": "' + "x" * 400 + '"}'))
        keys.append((job, 0))
    reader = progress.ProgressReader(spool)
    first = sum(len(p.report) for p in reader.collect(1e10, keys))
    second = sum(len(p.report) for p in reader.collect(1e10, keys))
    assert 0 < first <= 1000 and 0 < second <= 1000   # the rest went out at the next beat


def test_the_bound_of_a_heartbeats_reports_counts_bytes_not_characters(spool, user, monkeypatch):
    uid, gid = user
    monkeypatch.setattr(progress, "MAX_BEAT_BYTES", 1000)
    keys = []
    for job in range(1, 4):   # 300 characters of 4 bytes each: 1,200 bytes a report
        folder = progress.prepare(spool, job, 0, uid, gid)
        _as_user(uid, gid, lambda f=folder: (f / "rank0.json").write_text('{"pad": "' + "\U0001F600" * 300 + '"}',
                                                                          encoding="utf-8"))
        keys.append((job, 0))
    small = progress.prepare(spool, 4, 0, uid, gid)   # 100 characters of 4 bytes: 400 bytes, it fits
    _as_user(uid, gid, lambda: (small / "rank0.json").write_text('{"pad": "' + "\U0001F600" * 100 + '"}',
                                                                encoding="utf-8"))
    keys.append((4, 0))
    reader = progress.ProgressReader(spool)
    sent = {p.job_id: p.report for p in reader.collect(1e10, keys)}
    assert sent[4] and sum(len(r.encode()) for r in sent.values()) <= 1000   # the others wait (never cut)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_mounts_in_a_folder_are_found_from_the_kernels_table_names_with_spaces_too(tmp_path, monkeypatch):
    base = Path(os.path.realpath(tmp_path))
    where = base / "job1.0" / "progress" / "a b\\c"
    where.mkdir(parents=True)
    assert jobfiles.mount_points(base) == set()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(where)], check=True)
    try:
        found = jobfiles.mount_points(base)
        assert found == {str(where)}
        assert jobfiles.mounted_in(base / "job1.0" / "progress", found)
        assert jobfiles.mounted_in(where, found)
        assert not jobfiles.mounted_in(base / "job1.0" / "prog", found)   # a name that only begins the same
        assert not jobfiles.mounted_in(base / "job2.0", found)
        # a kernel without openat2: the table is read just before each open instead
        monkeypatch.setattr(jobfiles, "_openat2", [False])
        (where.parent / "plain").write_text("x")
        fd = os.open(where.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(UnsafeFile, match="another filesystem"):
                jobfiles.open_beneath(fd, "a b\\c", os.O_PATH)
            os.close(jobfiles.open_beneath(fd, "plain", os.O_RDONLY))
        finally:
            os.close(fd)
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
def test_a_fuse_filesystem_that_never_answers_is_never_entered_whenever_it_is_mounted(tmp_path):
    """A job may mount (fusermount) on its progress folder, or on a name in it, at any moment, also
    after the daemon has opened the folder: each look (open, lstat) refuses to cross into the mount at
    that moment, in the kernel, and never asks the filesystem anything (its server would never answer)."""
    import threading
    base = tmp_path / "job1.0"
    progress = base / "progress"
    (progress / "sub").mkdir(parents=True)
    (progress / "rank0.json").write_text("{}")
    folder = jobfiles.OwnerDir(progress)   # opened before the mounts
    fds, results = [], {}

    def hung(where):
        fd = os.open("/dev/fuse", os.O_RDWR)
        fds.append((fd, where))
        subprocess.run(["mount", "-t", "fuse", "-o", f"fd={fd},rootmode=40000,user_id=0,group_id=0", "hung",
                        str(where)], pass_fds=(fd,), check=True, capture_output=True)

    def look(what, call):
        try:
            results[what] = call()
        except Exception as e:
            results[what] = e

    try:
        hung(progress / "sub")   # a name in the folder already open
        hung(progress)           # and the folder itself
        looks = [("stat sub", lambda: folder.mtime("sub")), ("read sub", lambda: folder.read("sub", 100)),
                 ("open progress", lambda: jobfiles.OwnerDir(progress)),
                 ("owner dir", lambda: jobfiles.make_owner_dir(base, "progress", os.getuid(), os.getgid()))]
        threads = [threading.Thread(target=look, args=one, daemon=True) for one in looks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert not any(t.is_alive() for t in threads), results   # none hung in the mount
        for what, _ in looks:
            assert isinstance(results[what], UnsafeFile) and "another filesystem" in str(results[what]), results
        assert folder.mtime("rank0.json")   # (what is not a mount is read as before)
    finally:
        for fd, where in reversed(fds):
            os.close(fd)   # the server is gone: what waited in the mount gets ENOTCONN
            subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)
        folder.close()



def _ext4(folder) -> None:
    """Skip unless `folder` is on ext4 and lsattr can show its attributes."""
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(folder)], capture_output=True, text=True).stdout.strip()
    if kind != "ext2/ext3" or not shutil.which("lsattr"):
        pytest.skip(f"the spool is on {kind or 'an unknown filesystem'}, not ext4 (or lsattr is missing)")


def _attributes(path) -> str:
    """The file attributes lsattr shows (ext2/3/4's), e.g. "-------------Te-------"."""
    return subprocess.run(["lsattr", "-d", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]


def _groups(spool, runs) -> set[int]:
    """Where new run folders made in the spool are, by 8,192 inodes (ext4's group at its default inode
    ratio: another flex group of 16 groups is a bucket or more away at that ratio and above)."""
    return {jobfiles.ensure_job_dir(spool, job_id, 0).stat().st_ino // 8192 for job_id in runs}


def test_the_spool_spreads_its_run_folders_over_the_filesystem(spool):
    # ext4's TOPDIR flag ("T" to lsattr): the run folders go to groups of their own, not all to the spool's
    _ext4(spool)
    if int(subprocess.run(["stat", "-f", "-c", "%c", str(spool)], capture_output=True, text=True).stdout) < 1 << 20:
        pytest.skip("a filesystem this small has too few groups to spread over")
    plain = spool.parent / "plain"   # the reference: a spool not marked, on the same filesystem
    plain.mkdir()
    assert "T" not in _attributes(spool)
    assert jobfiles.spread_runs(spool)
    assert "T" in _attributes(spool) and "T" not in _attributes(plain)
    assert jobfiles.spread_runs(spool) and "T" in _attributes(spool)   # (set again: kept)
    # what the flag is for: the folders leave the spool's own group (for the one with the fewest folders)
    home = plain.stat().st_ino // 8192
    assert _groups(plain, range(12)) <= {home, home + 1}   # the plain spool's own group (or across one edge)
    home = spool.stat().st_ino // 8192
    assert _groups(spool, range(12)) - {home - 1, home, home + 1}


def test_a_spool_on_a_filesystem_without_the_flag_is_left_as_it_is():
    kind = subprocess.run(["stat", "-f", "-c", "%T", "/dev/shm"], capture_output=True, text=True).stdout.strip()
    if kind != "tmpfs" or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no tmpfs at /dev/shm to write in")
    top = Path(tempfile.mkdtemp(dir="/dev/shm"))   # tmpfs
    try:
        assert jobfiles.spread_runs(top) is False
        assert top.is_dir()
    finally:
        top.rmdir()


def test_a_trash_that_is_not_the_daemons_folder_is_left_alone(spool, caplog):
    # the spool is root's, so only root could put these there: still, a run's folder never goes into them
    import logging
    caplog.set_level(logging.WARNING, logger="airnoded")
    elsewhere = spool.parent / "elsewhere"
    elsewhere.mkdir()
    for kind in ("link", "file"):
        trash = spool / jobfiles.TRASH
        if kind == "link":
            trash.symlink_to(elsewhere)
        else:
            trash.write_text("not a folder")
        folder = jobfiles.ensure_job_dir(spool, 30, 0)
        jobfiles.remove_job_dir(spool, 30, 0)
        assert folder.is_dir() and os.listdir(elsewhere) == []   # not moved, through the link or anywhere
        assert (trash.is_symlink() if kind == "link" else trash.read_text() == "not a folder")
        assert any("not removed yet" in r.getMessage() and "is not the daemon's folder" in r.getMessage()
                   for r in caplog.records)
        caplog.clear()
        trash.unlink()


@pytest.mark.parametrize("name, expected", [
    ("job11.2", (11, 2)), (f"job{2**64 - 1}.{2**32 - 1}", (2**64 - 1, 2**32 - 1)),   # (a job id is a uint64)
    ("job1.", None), ("job.1", None), ("job².1", None), ("job٣.1", None), ("job1.2.3", None), ("jobx.1", None),
    ("job" + "1" * 21 + ".1", None), ("trash", None),
])
def test_run_folder_names_are_read_as_the_daemon_writes_them(name, expected):
    assert jobfiles.parse_job_dir(name) == expected
