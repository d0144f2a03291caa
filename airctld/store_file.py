"""The store as a file, for its admins: an online backup and an integrity check.

A backup is SQLite's online backup of the live file, taken in one step under a read transaction:
in WAL mode that is a snapshot of the last commit, and the controller goes on writing meanwhile.
The copy is written aside, checked whole, made private (it holds job scripts and environments),
synced, and only then renamed into place, so a path that names a backup always names a whole one.
"""
from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path


class StoreFileError(Exception):
    pass


@dataclass(frozen=True)
class Report:
    path: str
    schema: int
    problems: tuple[str, ...]     # empty: the file is sound
    jobs: int = 0
    active_jobs: int = 0
    size_bytes: int = 0

    @property
    def sound(self) -> bool:
        return not self.problems


def problems(conn: sqlite3.Connection, quick: bool) -> tuple[str, ...]:
    """What SQLite's own check finds wrong with the database; () when it is sound. quick_check
    reads every page and row but skips comparing indexes with their tables."""
    try:
        rows = conn.execute("PRAGMA quick_check" if quick else "PRAGMA integrity_check").fetchall()
    except sqlite3.DatabaseError as e:   # not a database, or damaged past reading
        return (str(e),)
    found = tuple(str(r[0]) for r in rows)
    return () if found == ("ok",) else found


def damage(path: str) -> tuple[str, ...]:
    """At the controller's start: what a quick check finds wrong with the store at `path` (() for a
    sound file, or none yet)."""
    if not os.path.exists(path):
        return ()
    conn = sqlite3.connect(path, timeout=30)
    try:
        return problems(conn, quick=True)
    finally:
        conn.close()


def check(path: str, quick: bool = False) -> Report:
    """The store's integrity, schema version and size. The file must exist."""
    if not os.path.isfile(path):
        raise StoreFileError(f"no store at {path}")
    conn = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, timeout=30)
    try:
        found = problems(conn, quick)
        try:
            schema = conn.execute("PRAGMA user_version").fetchone()[0]
            jobs, active = conn.execute("SELECT count(*), coalesce(sum(phase != 4), 0) FROM jobs").fetchone()
        except sqlite3.DatabaseError as e:
            return Report(path, 0, found or (str(e),), size_bytes=_size(path))
        return Report(path, schema, found, jobs, active, _size(path))
    finally:
        conn.close()


def backup(source: str, dest: str, now: float | None = None) -> tuple[Report, float]:
    """Copy the store at `source` to `dest` (a file, or a folder to hold air-<UTC time>.db) while the
    controller runs; returns the copy's full check and the seconds the copy took. Nothing is left at
    `dest` unless the copy is whole and sound."""
    src = Path(source).resolve()
    if not src.is_file():
        raise StoreFileError(f"no store at {source}")
    target = Path(dest)
    if target.is_dir():
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
        target = target / f"air-{stamp}.db"
    target = target.parent.resolve() / target.name
    if target in (src, Path(f"{src}-wal"), Path(f"{src}-shm"), Path(f"{src}-journal")):
        raise StoreFileError(f"{target} is the live store; give another path")
    if not target.parent.is_dir():
        raise StoreFileError(f"no folder {target.parent}")
    tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    started = time.monotonic()
    try:
        live = sqlite3.connect(src.as_uri() + "?mode=ro", uri=True, timeout=30)
        copy = sqlite3.connect(tmp)
        try:
            live.backup(copy)              # pages=-1: all in one step, one snapshot
            copy.execute("PRAGMA journal_mode=DELETE")   # one self-contained file
        finally:
            live.close()
            copy.close()
        took = time.monotonic() - started
        report = check(str(tmp))
        if not report.sound:
            raise StoreFileError(f"the copy failed its check ({'; '.join(report.problems[:3])}); "
                                 f"is the live store damaged? run: aircontrol store check")
        _sync(tmp)
        os.replace(tmp, target)
        _sync(target.parent)
    except sqlite3.Error as e:
        _unlink(tmp)
        raise StoreFileError(f"cannot back up {src}: {e}") from e
    except BaseException:
        _unlink(tmp)
        raise
    return Report(str(target), report.schema, (), report.jobs, report.active_jobs, _size(str(target))), took


def _sync(path: Path) -> None:
    """fsync a file, or a folder (after a rename in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


SKIP_IDS_BLIND = 1_000_000   # ids skipped on a restore when the store replaced cannot say its last one


def last_job_id(path: str) -> int | None:
    """The highest job id the store at `path` gave out, if it can still say (a damaged file may not)."""
    if not os.path.isfile(path):
        return None
    try:
        conn = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, timeout=5)
        try:
            seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
            top = conn.execute("SELECT max(id) FROM jobs").fetchone()
        finally:
            conn.close()
        return max(seq[0] if seq else 0, top[0] or 0)
    except sqlite3.Error:
        return None


def restore(backup_path: str, store_path: str, known_schema: int, now: float | None = None) -> tuple[Report, int, str]:
    """Put a backup in the store's place (the controller stopped: the caller holds its lock). Job ids go
    on past the highest the replaced store gave out (or SKIP_IDS_BLIND past the backup's, when the
    replaced store cannot say), so that no id names two jobs: a job submitted after the backup may
    still run somewhere. The replaced store is kept beside, renamed, with its last commits. Returns
    the new store's check, the next job id, and where the replaced store went ("" if none).

    A kill at any point leaves a store in place: the old one (its log folded in) until the new one,
    whole and synced, replaces it in one rename."""
    checked = check(backup_path)
    if not checked.sound:
        raise StoreFileError(f"the backup {backup_path} is damaged ({'; '.join(checked.problems[:3])})")
    if checked.schema > known_schema:
        raise StoreFileError(f"the backup {backup_path} has schema {checked.schema}, newer than this airctld "
                             f"knows ({known_schema}); restore it with a newer airctld")
    store = Path(store_path).resolve()
    owner = os.stat(store.parent)   # the controller's user: what its files belong to
    for stale in store.parent.glob(f".{store.name}.*.restore"):   # an earlier restore's, killed midway
        _unlink(stale)
    _fold_log(store)
    replaced_last = last_job_id(str(store))
    backup_last = last_job_id(backup_path) or 0
    base = max(backup_last, replaced_last) if replaced_last is not None else backup_last + SKIP_IDS_BLIND
    tmp = store.parent / f".{store.name}.{os.getpid()}.restore"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        if os.geteuid() == 0:
            os.fchown(fd, owner.st_uid, owner.st_gid)
    finally:
        os.close(fd)
    try:
        src = sqlite3.connect(Path(backup_path).resolve().as_uri() + "?mode=ro", uri=True, timeout=30)
        dst = sqlite3.connect(tmp)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")
            with dst:
                dst.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'jobs'", [base])
                if dst.execute("SELECT changes()").fetchone()[0] == 0:
                    dst.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?)", [base])
        finally:
            src.close()
            dst.close()
        _sync(tmp)
        aside = ""
        if store.exists():   # kept under a second name first: the store has a name at every moment
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
            aside = str(store.with_name(f"{store.name}.replaced-{stamp}"))
            os.link(store, aside)
            for suffix in ("-wal", "-journal"):   # commits not folded in (a store too damaged to open)
                if os.path.exists(f"{store}{suffix}") and os.path.getsize(f"{store}{suffix}"):
                    os.link(f"{store}{suffix}", f"{aside}{suffix}")
        for suffix in ("-wal", "-shm", "-journal"):   # the old store's, never to be read with the new one
            _unlink(Path(f"{store}{suffix}"))
        os.replace(tmp, store)
        _sync(store.parent)
    except (sqlite3.Error, OSError) as e:
        _unlink(tmp)
        raise StoreFileError(f"cannot restore {backup_path}: {e}") from e
    except BaseException:
        _unlink(tmp)
        raise
    return check(str(store)), base + 1, aside


def _fold_log(store: Path) -> None:
    """The store's write-ahead log folded into its file, where SQLite can (a killed airctld leaves its
    last commits there); a store too damaged for that keeps its log beside it."""
    if not store.exists():
        return
    try:
        conn = sqlite3.connect(store, timeout=30)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    except sqlite3.Error:
        pass


def interrupted_restore(store_path: str) -> str:
    """A replaced store with no store in its place: a restore killed midway (or a store removed by
    hand); "" when the store is there, or was never replaced."""
    store = Path(store_path)
    if store.exists():
        return ""
    left = sorted(store.parent.glob(f"{store.name}.replaced-*"))
    return str(left[-1]) if left else ""


def lock(state_dir: str):
    """The controller's lock on its state folder: one airctld per store, and no restore under a live
    one. Returns the open descriptor (held until the process exits); StoreFileError if taken."""
    import fcntl
    os.makedirs(state_dir, exist_ok=True)
    fd = os.open(os.path.join(state_dir, "airctld.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        if os.geteuid() == 0:   # (made by root for a restore: still the controller's user's)
            owner = os.stat(state_dir)
            os.fchown(fd, owner.st_uid, owner.st_gid)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StoreFileError(f"an airctld runs on {state_dir} (it holds {state_dir}/airctld.lock)") from None
    return fd
