"""A job's folder on this node, handled by a root daemon without trusting anything the job wrote.

Layout under the spool (which only the daemon may write):

    job<ID>/            root, 0711: users may pass through it, never write or list it
      script            created by root (O_EXCL, no links), then fchown'ed to the job's owner, 0700
      pgid, run         root's own records, 0600
      stop_reason       written by root, 0644: why the job is being stopped
      progress/         the owner's, 0700: the ranks write their reports here

Everything root does inside `progress/` goes through a directory descriptor opened without
following links, and every file there is opened with O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, then
checked with fstat (a regular file, owned by the job's owner, within a size limit) before a
byte is read. Root never writes, chmods or chowns anything in a folder a user can write.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

if not shutil.rmtree.avoids_symlink_attacks:   # pragma: no cover - every Linux Python has it
    raise ImportError("airnoded needs a shutil.rmtree that does not follow links (Linux, fd-based)")

JOB_DIR_MODE = 0o711
OWNER_DIR_MODE = 0o700
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFile(Exception):
    """A file a job controls that the daemon refuses to read: a link, a FIFO, a device, another
    user's file, one over the size limit."""


def job_dir(spool: Path, job_id: int) -> Path:
    return spool / f"job{job_id}"


def check_spool(spool: Path) -> None:
    """The spool must be a real folder of the daemon's user that nobody else may write; raises
    OSError naming what is wrong."""
    st = os.lstat(spool)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"spool {spool} is not a folder (a link?)")
    if st.st_uid != os.geteuid():
        raise OSError(f"spool {spool} belongs to uid {st.st_uid}, not to this daemon (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise OSError(f"spool {spool} may be written by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                      "chmod go-w it")


def create_job_dir(spool: Path, job_id: int) -> Path:
    """A fresh folder for this run of the job: whatever an earlier run left is removed first."""
    path = job_dir(spool, job_id)
    remove_job_dir(spool, job_id)
    os.mkdir(path, JOB_DIR_MODE)
    os.chmod(path, JOB_DIR_MODE)   # whatever the umask took away
    return path


def ensure_job_dir(spool: Path, job_id: int) -> Path:
    """The job's folder, made if missing (nodes that only run ranks); never one a user could have put
    there: the spool is the daemon's own."""
    path = job_dir(spool, job_id)
    try:
        os.mkdir(path, JOB_DIR_MODE)
        os.chmod(path, JOB_DIR_MODE)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"{path} is not the daemon's folder") from None
    return path


def remove_job_dir(spool: Path, job_id: int) -> None:
    """shutil.rmtree works on directory descriptors on Linux (`rmtree.avoids_symlink_attacks`) and never
    follows a link out of the tree a job may have filled."""
    shutil.rmtree(job_dir(spool, job_id), ignore_errors=True)


def write_root_file(folder: Path, name: str, data: bytes, mode: int, owner: tuple[int, int] | None = None) -> None:
    """Write `folder/name` aside and rename it into place, in a folder only root writes. With `owner`,
    the new file is fchown'ed to (uid, gid) through its descriptor, never through a path."""
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


def read_root_file(folder: Path, name: str, limit: int = 4096) -> bytes:
    """A file root wrote in its own folder (still opened without following links)."""
    dirfd = os.open(folder, _DIR_FLAGS)
    try:
        return _read_checked(dirfd, name, os.geteuid(), limit)
    finally:
        os.close(dirfd)


def make_owner_dir(folder: Path, name: str, uid: int, gid: int) -> Path:
    """`folder/name` for the job's owner to write in (made by root in root's folder, then given away)."""
    dirfd = os.open(folder, _DIR_FLAGS)
    try:
        try:
            os.mkdir(name, OWNER_DIR_MODE, dir_fd=dirfd)
        except FileExistsError:
            pass
        fd = os.open(name, _DIR_FLAGS, dir_fd=dirfd)
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

    def __init__(self, path: Path):
        self.fd = os.open(path, _DIR_FLAGS)
        self.owner = os.fstat(self.fd).st_uid

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
        st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        _check(name, st, self.owner, limit=st.st_size)
        return st.st_mtime

    def read(self, name: str, limit: int) -> bytes:
        return _read_checked(self.fd, name, self.owner, limit)


def _read_checked(dirfd: int, name: str, owner: int, limit: int) -> bytes:
    before = os.stat(name, dir_fd=dirfd, follow_symlinks=False)   # nothing but a regular file is opened
    _check(name, before, owner, limit)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dirfd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):   # swapped for a link, or a socket
            raise UnsafeFile(f"{name} is a link or not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise UnsafeFile(f"{name} was replaced while it was being opened")
        _check(name, st, owner, limit)
        data = os.read(fd, limit + 1)
        if len(data) > limit:
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
