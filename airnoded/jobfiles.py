"""A run's folder on this node, handled by a root daemon without trusting anything the job wrote.

Layout under the spool (which only the daemon may write, nor any folder above it):

    job<ID>.<RUN>/      root, 0711: users may pass through it, never write or list it
      script            created by root (O_EXCL, no links), then fchown'ed to the job's owner, 0700
      pgid              root's own record, 0600
      stop_reason       written by root, 0640, group of the job: why the run is being stopped
      progress/         the owner's, 0700: the ranks write their reports here
    .trash/             root, 0700: folders being removed

Each run of a job (its restart count) has a folder of its own, so nothing one run leaves or
removes touches another. Everything root does inside `progress/` goes through a directory
descriptor opened without following links, on the spool's own filesystem (not a mount the user
put there), and every file there is looked at with lstat, opened with O_NOFOLLOW | O_NONBLOCK |
O_NOCTTY, then checked with fstat (the same inode, a regular file, owned by the job's owner,
within a size limit) before a byte is read. Root never writes, chmods or chowns anything in a
folder a user can write. A folder is removed by first renaming it into `.trash/` (at once), then
emptied by a janitor thread, without recursion and a bounded amount at a time: a tree a job made
as deep or as wide as it likes never holds up another thread of the daemon, nor crashes it.

A filesystem the owner mounts on `progress/` or in it (FUSE, through fusermount) is never entered:
a FUSE server that does not answer hangs whoever looks in, root included, and a heartbeat held so
would fence the node and stop every job on it. Every name in a run's folder is opened (or looked at)
with openat2 and RESOLVE_NO_XDEV (`open_beneath`): the kernel refuses to cross into another mount
before it asks the mounted filesystem anything, at the moment of the open, however often the job
mounts and unmounts meanwhile. A kernel without openat2 (before 5.6) gets the kernel's mount table
read just before each open instead (`mount_points`), which leaves a window a job could hit.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import itertools
import logging
import os
import re
import stat
import sys
import threading
import time
from pathlib import Path

from air.protos.limits import is_number

log = logging.getLogger("airnoded")

JOB_DIR_MODE = 0o711
OWNER_DIR_MODE = 0o700
TRASH = ".trash"
REMOVE_BUDGET = 100_000   # entries the janitor removes in one slice
JANITOR_SLICES = 1000     # slices at most for each wake-up
JANITOR_RETRY_S = 60.0    # how often what could not be removed is tried again
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_names = itertools.count()
# linux/fs.h, as 64-bit x86, arm, riscv and s390 number them (elsewhere, 32-bit systems included, the
# call is refused, and spread_runs does nothing)
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_TOPDIR_FL = 0x80086601, 0x40086602, 0x00020000
_janitors: dict[Path, "_Janitor"] = {}
_janitors_lock = threading.Lock()


class UnsafeFile(OSError):
    """A file a job controls that the daemon refuses to read: a link, a FIFO, a device, another
    user's file, one over the size limit, one on another filesystem."""


@functools.lru_cache(maxsize=4096)   # (asked for several times in a run's start and end)
def job_dir(spool: Path, job_id: int, run: int) -> Path:
    return spool / f"job{job_id}.{run}"


def parse_job_dir(name: str) -> tuple[int, int] | None:
    """(job id, run) of a run folder's name, None for anything else."""
    if not name.startswith("job"):
        return None
    job, dot, run = name[3:].partition(".")
    if not (dot and is_number(job, 20) and is_number(run, 20)):
        return None
    return int(job), int(run)


def check_spool(spool: Path) -> None:
    """The spool and every folder above it must be safe from other users: owned by root or this
    daemon's user, and writable by no one else (a sticky folder such as /tmp is fine above the
    spool). Raises OSError naming what is wrong."""
    me = os.geteuid()
    st = os.lstat(spool)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"spool {spool} is not a folder (a link?)")
    if st.st_uid != me:
        raise OSError(f"spool {spool} belongs to uid {st.st_uid}, not to this daemon (uid {me})")
    if st.st_mode & 0o022:
        raise OSError(f"spool {spool} may be written by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                      "chmod go-w it")
    for folder in Path(os.path.realpath(spool)).parents:
        st = os.stat(folder)
        if st.st_uid not in (0, me):
            raise OSError(f"{folder}, above the spool, belongs to uid {st.st_uid}: another user could move "
                          "the spool; keep it under folders of root")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise OSError(f"{folder}, above the spool, may be written by other users (mode "
                          f"{stat.S_IMODE(st.st_mode):o})")


def create_job_dir(spool: Path, job_id: int, run: int, keep: bool = False) -> Path:
    """A fresh folder for this run of the job: whatever an earlier start of the same run left is
    removed first, unless `keep` (a step of the run that came first is using it)."""
    if not keep:
        remove_job_dir(spool, job_id, run)
    return ensure_job_dir(spool, job_id, run)


def ensure_job_dir(spool: Path, job_id: int, run: int) -> Path:
    """The run's folder, made if missing (nodes that only run ranks); never one a user could have put
    there: the spool is the daemon's own."""
    path = job_dir(spool, job_id, run)
    try:
        os.mkdir(path, JOB_DIR_MODE)
    except FileExistsError:
        pass
    fd = os.open(path, _DIR_FLAGS)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise OSError(f"{path} is not the daemon's folder")
        os.fchmod(fd, JOB_DIR_MODE)   # whatever the umask took away
    finally:
        os.close(fd)
    return path


def spread_runs(spool: Path) -> bool:
    """Mark the spool as a top of directory trees (ext4's TOPDIR flag, `chattr +T`): ext4 then makes
    each run folder, with its files, in the flex group with the fewest folders (its search starting at
    a hash of the folder's name) rather than all in the spool's own. On ext4 without a journal, each
    new inode is taken only after a scan past those its group freed in the last minute (six, while
    the inode table's block is not written back: ialloc.c's recently_deleted): a node running short
    jobs frees thousands in one group, and those scans took up to a third of its daemon's CPU in a
    burst of trivial jobs. Whether the flag is set (False on a filesystem without it, which changes
    nothing)."""
    try:
        fd = os.open(spool, _DIR_FLAGS)
    except OSError:
        return False
    try:
        flags = bytearray(8)   # (the kernel reads and writes an int of it)
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags)
        now = int.from_bytes(flags[:4], sys.byteorder)
        if not now & _FS_TOPDIR_FL:
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, (now | _FS_TOPDIR_FL).to_bytes(4, sys.byteorder) + bytes(4))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_job_dir(spool: Path, job_id: int, run: int) -> None:
    """Move the run's folder into the trash (a rename: at once, whatever the job put in it) for the
    spool's janitor to empty. Never raises: a folder that cannot be moved now is logged."""
    try:
        trash = _trash(spool)
        try:
            os.rename(job_dir(spool, job_id, run), trash / f"job{job_id}.{run}.{os.getpid()}.{next(_names)}")
        except FileNotFoundError:
            return
        clean_trash_soon(spool)
    except Exception as e:   # a job's tree must never cost the daemon a thread or a start
        log.warning("job %d: run %d's folder not removed yet: %s", job_id, run, e)


def clean_trash_soon(spool: Path) -> None:
    """Have the spool's janitor empty its trash (started on first use; one thread per spool)."""
    with _janitors_lock:
        janitor = _janitors.get(spool)
        if janitor is None:
            janitor = _janitors[spool] = _Janitor(spool)
    janitor.wake()


class _Janitor:
    """Empties a spool's trash on a thread of its own, REMOVE_BUDGET entries at a time: a tree a job made,
    however deep or wide, never holds up a heartbeat (whose lateness would fence the node and stop every
    job on it), a launch or a step. What cannot be removed now is tried again every JANITOR_RETRY_S."""

    def __init__(self, spool: Path):
        self.spool = spool
        self._wake = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="trash-janitor").start()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        stuck: set[str] = set()   # what could not be removed: skipped until the next retry
        retry_at = time.monotonic() + JANITOR_RETRY_S
        while True:
            self._wake.wait(JANITOR_RETRY_S)
            self._wake.clear()
            if time.monotonic() >= retry_at:   # (tried, and said, again once a while: not at every job's end)
                stuck.clear()
                retry_at = time.monotonic() + JANITOR_RETRY_S
            try:
                for _ in range(JANITOR_SLICES):   # until nothing is left but what is stuck
                    if empty_trash(self.spool, stuck=stuck):
                        break
                    time.sleep(0.001)
            except Exception as e:   # (the thread goes on: the next wake-up tries again)
                log.warning("the trash of %s not emptied: %s", self.spool, e)


def empty_trash(spool: Path, budget: int | None = None, stuck: set[str] | None = None) -> bool:
    """Remove what is in the trash, without recursion: a subfolder is moved up into the trash and
    emptied in its turn, so at most two descriptors are open whatever the depth. `stuck`: names that
    cannot go now (a mount a user made, an immutable file), skipped, and added to (with a warning)
    as others turn out so; a caller that keeps it skips them in its later calls too. True when
    nothing is left but those."""
    budget = budget or REMOVE_BUDGET
    stuck = set() if stuck is None else stuck
    trash_fd = os.open(_trash(spool), _DIR_FLAGS)
    try:
        while budget > 0:
            with os.scandir(trash_fd) as it:
                pending = [e.name for e in itertools.islice(it, 64 + len(stuck)) if e.name not in stuck]
            if not pending:
                return True
            for name in pending:
                try:
                    budget -= _empty_one(trash_fd, name, budget)
                except OSError as e:
                    stuck.add(name)
                    budget -= 1
                    log.warning("%s in the trash cannot be removed now: %s", name, e.strerror or e)
                if budget <= 0:
                    break
        return False
    finally:
        os.close(trash_fd)


def _empty_one(trash_fd: int, name: str, budget: int) -> int:
    """Empty trash/name a batch at a time and remove it; returns the work done."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=trash_fd)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            os.unlink(name, dir_fd=trash_fd)
            return 1
        if e.errno == errno.ENOENT:
            return 1
        raise
    done = 1
    try:
        while done < budget:
            with os.scandir(fd) as it:
                entries = [e.name for e in itertools.islice(it, 1024)]
            if not entries:
                break
            for entry in entries:
                done += 1
                try:
                    os.unlink(entry, dir_fd=fd)
                except IsADirectoryError:   # a folder: up into the trash, emptied in its turn
                    os.rename(entry, f"d{os.getpid()}.{next(_names)}", src_dir_fd=fd, dst_dir_fd=trash_fd)
                except FileNotFoundError:
                    pass
    finally:
        os.close(fd)
    if done < budget:
        os.rmdir(name, dir_fd=trash_fd)
    return done


def _trash(spool: Path) -> Path:
    trash = spool / TRASH
    try:
        st = os.lstat(trash)   # (there already, but for a spool's first run's end: a look, not a mkdir)
    except FileNotFoundError:
        try:
            os.mkdir(trash, 0o700)
            return trash
        except FileExistsError:
            st = os.lstat(trash)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{trash} is not the daemon's folder")
    return trash


def write_root_file(folder: Path, name: str, data: bytes, mode: int, owner: tuple[int, int] | None = None) -> None:
    """Write `folder/name` aside and rename it into place, in a folder only root writes. With `owner`,
    the new file is fchown'ed to (uid, gid) through its descriptor, never through a path.
    The rename makes it whole or absent to a daemon killed at any point; there is no fsync, because
    these files describe the host's processes (runs, their groups, a fence, runs given up), which a
    crash of the host itself ends too: a daemon that finds one empty after a reboot adopts nothing by
    it, or drains again, the safe side either way."""
    dirfd = os.open(folder, _DIR_FLAGS)
    tmp = f".{name}.tmp"
    try:
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=dirfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, owner[0], owner[1])
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    finally:
        os.close(dirfd)


def read_root_file(folder: Path, name: str, limit: int = 4096, head: bool = False) -> bytes:
    """A file root wrote in its own folder (still opened without following links); with `head`, its
    first `limit` bytes whatever its size (else a larger one is refused)."""
    dirfd = os.open(folder, _DIR_FLAGS)
    try:
        return _read_checked(dirfd, name, os.geteuid(), limit, head)
    finally:
        os.close(dirfd)


_SYS_OPENAT2 = 437   # the same number on x86_64 and arm64
_RESOLVE = 0x01 | 0x04 | 0x08   # RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_openat2 = [None]   # whether the kernel has openat2 (known after the first call)


def open_beneath(dir_fd: int, name: str, flags: int) -> int:
    """os.open(name, flags, dir_fd=dir_fd) that never crosses into another mount (EXDEV: UnsafeFile)
    nor follows a link (ELOOP; with O_PATH | O_NOFOLLOW a link itself is opened, for fstat)."""
    if _openat2[0] is not False:
        how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE)
        fd = _libc.syscall(_SYS_OPENAT2, dir_fd, os.fsencode(name), ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            _openat2[0] = True
            return fd
        err = ctypes.get_errno()
        unknown = err == errno.ENOSYS or (err == errno.EPERM and _openat2[0] is None)   # (EPERM: a seccomp filter)
        if not unknown:
            if err == errno.EXDEV:
                raise UnsafeFile(f"{name} is on another filesystem than its folder (a mount)")
            raise OSError(err, os.strerror(err), name)
        _openat2[0] = False
    folder = Path(os.readlink(f"/proc/self/fd/{dir_fd}"))   # (root's folder: its path is root's to name)
    if mounted_in(folder / name, mount_points(folder / name)):
        raise UnsafeFile(f"{name} is on another filesystem than its folder (a mount)")
    return os.open(name, flags | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)


def lstat_beneath(dir_fd: int, name: str) -> os.stat_result:
    """os.stat(name, dir_fd=dir_fd, follow_symlinks=False), never entering another mount."""
    fd = open_beneath(dir_fd, name, os.O_PATH | os.O_NOFOLLOW)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


MOUNTINFO = "/proc/self/mountinfo"
_ESCAPED = re.compile(rb"\\([0-7]{3})")   # mountinfo writes space, tab, newline and backslash as \ooo


def mount_points(below: Path) -> set[str]:
    """The mount points at or below `below` (an absolute path without links), read from the kernel's
    mount table: reading it never enters a mounted filesystem."""
    top = os.fsencode(below)
    found = set()
    with open(MOUNTINFO, "rb") as f:
        for line in f:
            fields = line.split(b" ", 5)
            if len(fields) < 5:
                continue
            point = _ESCAPED.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), fields[4])
            if point == top or point.startswith(top + b"/"):
                found.add(os.fsdecode(point))
    return found


def mounted_in(folder: Path, points: set[str]) -> bool:
    """Whether one of `points` (from mount_points) is `folder` or below it."""
    top = str(folder)
    return any(p == top or p.startswith(top + "/") for p in points)


def make_owner_dir(folder: Path, name: str, uid: int, gid: int) -> Path:
    """`folder/name` for the job's owner to write in (made by root in root's folder, then given away).
    One with a filesystem mounted on it (the owner's) is refused without being entered."""
    dirfd = os.open(folder, _DIR_FLAGS)
    try:
        try:
            os.mkdir(name, OWNER_DIR_MODE, dir_fd=dirfd)
        except FileExistsError:
            pass
        fd = open_beneath(dirfd, name, _DIR_FLAGS)
        try:
            st = os.fstat(fd)
            if st.st_uid not in (uid, os.geteuid()):
                raise OSError(f"{folder / name} belongs to uid {st.st_uid}")
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.fchown(fd, uid, gid)
            os.fchmod(fd, OWNER_DIR_MODE)
        finally:
            os.close(fd)
    finally:
        os.close(dirfd)
    return folder / name


class OwnerDir:
    """A folder the job's owner writes, open for reading by root: the descriptor was opened without
    following links, so the names looked up in it are the folder's own, whatever the job does."""

    def __init__(self, path: Path, device: int | None = None):
        parent = os.open(path.parent, _DIR_FLAGS)   # (root's)
        try:
            self.fd = open_beneath(parent, path.name, _DIR_FLAGS)
        finally:
            os.close(parent)
        st = os.fstat(self.fd)
        if device is not None and st.st_dev != device:   # a filesystem the user mounted there (FUSE)
            os.close(self.fd)
            raise UnsafeFile(f"{path.name} is on another filesystem than the spool (a mount)")
        self.owner = st.st_uid

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "OwnerDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def names(self, limit: int) -> list[str]:
        """At most `limit` names in the folder (a job may make millions; the rest are not looked at)."""
        out = []
        with os.scandir(self.fd) as entries:
            for entry in entries:
                out.append(entry.name)
                if len(out) >= limit:
                    break
        return out

    def mtime(self, name: str) -> float:
        """The modification time of a regular file of the owner's, without opening it."""
        st = lstat_beneath(self.fd, name)
        _check(name, st, self.owner, limit=st.st_size)
        return st.st_mtime

    def read(self, name: str, limit: int) -> bytes:
        return _read_checked(self.fd, name, self.owner, limit)


def _read_checked(dirfd: int, name: str, owner: int, limit: int, head: bool = False) -> bytes:
    size_limit = 1 << 62 if head else limit
    before = lstat_beneath(dirfd, name)   # nothing but a regular file is opened
    _check(name, before, owner, size_limit)
    try:
        fd = open_beneath(dirfd, name, _READ_FLAGS)
    except UnsafeFile:
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):   # swapped for a link, or a socket
            raise UnsafeFile(f"{name} is a link or not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise UnsafeFile(f"{name} was replaced while it was being opened")
        _check(name, st, owner, size_limit)
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            if head:
                return data[:limit]
            raise UnsafeFile(f"{name} is over {limit} bytes")
        return data
    finally:
        os.close(fd)


def _check(name: str, st: os.stat_result, owner: int, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) \
            else "not a regular file"
        raise UnsafeFile(f"{name} is {kind}")
    if st.st_uid != owner:
        raise UnsafeFile(f"{name} belongs to uid {st.st_uid}, not to the job's owner (uid {owner})")
    if st.st_size > limit:
        raise UnsafeFile(f"{name} is {st.st_size} bytes; the limit is {limit}")
