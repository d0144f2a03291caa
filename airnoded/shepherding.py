"""The daemon's side of a shepherd (airnoded/shepherd.py): start one, or adopt one an earlier daemon
started, and follow its events.

In the run's folder (root's, 0711), for a shepherd named TAG ("batch", "step3"):

    TAG.record      "shepherd PID START BOOT": the shepherd itself, in place (written aside, renamed)
                    before it starts anything; then its events, appended by the shepherd (the whole history)
    TAG.events      a FIFO: the same events as they happen; end of file once the shepherd is gone (a batch
                    script's shepherd has a pipe to the daemon that started it instead: spawn, named)

A daemon that adopts a shepherd opens the FIFO first and then reads the record: every event is in
one or the other (the shepherd appends to the record before it writes to the FIFO), and the
events are told apart by (kind, child), so one seen twice counts once.

Pids and start times mean something only in the boot that wrote them: after a reboot (the spool
survives it) a record's processes are all gone, whatever now runs under their numbers, and only the
exits it holds count.
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from air.airnoded import cgroups, jobfiles
from air.airnoded.shepherd import boot_id, start_time
from air.protos.limits import is_number

log = logging.getLogger("airnoded")

PROGRAM = str(Path(__file__).with_name("shepherd.py"))
NATIVE = Path(__file__).with_name("air-shepherd")   # shepherd.c, built with the package when a compiler was there
BATCH = "batch"   # the tag of a run's batch script's shepherd (a step's is step<N>-<random>)
MAX_RECORD = 1 << 20
START_TIMEOUT_S = 30.0
SHEPHERD_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
_FIFO_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Start:
    """What a batch script's process does as its owner before it runs the script: enter the working
    directory and open the output files (made, or truncated, with the owner's rights only). A failure
    is written to the child's stdout and stderr (the daemon's start-up status pipe), exit code 126."""
    cwd: str
    out: str
    err: str = ""      # "": the same file as out
    truncate: bool = False


@dataclass
class Child:
    argv: list[str]
    env: dict[str, str]
    stdout: int        # the daemon's descriptors, passed to the shepherd
    stderr: int
    start: Start | None = None


@dataclass
class Herd:
    """A shepherd as the daemon sees it: which process, and what its children did so far."""
    folder: Path
    tag: str
    pid: int
    started: int
    fd: int                                    # the events FIFO's read end (-1: closed)
    proc: subprocess.Popen | Started | None = None   # when this daemon started it (to reap it)
    pids: dict[int, int] = field(default_factory=dict)    # child -> pid (and process group)
    starts: dict[int, int] = field(default_factory=dict)  # child -> its start time
    exits: dict[int, int] = field(default_factory=dict)   # child -> raw wait status
    ended: bool = False                        # the shepherd is gone (end of file on the FIFO)
    this_boot: bool = True                     # False: recorded before a reboot; none of its processes runs
    _partial: bytes = b""

    def fileno(self) -> int:
        return self.fd

    def _take(self, data: bytes) -> list[tuple[str, int]]:
        """New events in `data` (complete lines only): (kind, child)."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-4096:]
        new = []
        for line in lines:
            parts = line.split()
            if len(parts) < 3 or not all(is_number(p) for p in parts[1:]):
                continue
            index = int(parts[1])
            if parts[0] == b"pid" and len(parts) == 4 and index not in self.pids:
                self.pids[index], self.starts[index] = int(parts[2]), int(parts[3])
                new.append(("pid", index))
            elif parts[0] == b"exit" and index not in self.exits:
                self.exits[index] = int(parts[2])
                new.append(("exit", index))
        return new

    def read(self, timeout: float | None) -> list[tuple[str, int]]:
        """Events that arrived within `timeout` seconds (None: wait for some); at the shepherd's end,
        whatever its record holds that the FIFO did not bring."""
        if self.ended:
            return []
        poller = select.poll()
        if self.fd >= 0:   # (without one, followed by its process alone: the poll only waits)
            poller.register(self.fd, select.POLLIN)
        while True:
            # a FIFO that no writer opened since this daemon opened it never reports a hang-up: a
            # shepherd that died before its adoption is seen gone by its process, a second at most
            step = 1.0 if timeout is None else min(timeout, 1.0)
            if poller.poll(int(step * 1000)):
                break
            if not self.alive():
                return self._end()
            if self.fd < 0 and (new := self._take(self.record() + b"\n")):
                return new   # (followed by its process: what it recorded since, a second at most after)
            if timeout is not None:
                timeout -= step
                if timeout <= 0:
                    return []
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        if data:
            return self._take(data)
        return self._end()

    def _end(self) -> list[tuple[str, int]]:
        """The shepherd is gone: what the FIFO still holds, then its record."""
        new = []
        try:
            while data := os.read(self.fd, 65536):
                new += self._take(data)
        except OSError:
            pass
        self.ended = True
        self.close()
        return new + self._take(self.record() + b"\n")

    def alive(self) -> bool:
        """The shepherd still runs (a zombie does not: it holds no descriptor any more)."""
        if not self.this_boot:
            return False
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return fields[0] not in (b"Z", b"X") and int(fields[19]) == self.started
        except (OSError, ValueError, IndexError):
            return False

    def record(self) -> bytes:
        try:
            return jobfiles.read_root_file(self.folder, f"{self.tag}.record", MAX_RECORD)
        except (OSError, jobfiles.UnsafeFile):
            return b""

    def running(self) -> dict[int, int]:
        """child -> process group of the children that have not ended."""
        if not self.this_boot:
            return {}
        return {i: p for i, p in self.pids.items() if i not in self.exits}

    def wait(self) -> None:
        """Until the shepherd is gone; then reap it if it is this daemon's child."""
        while not self.ended:
            self.read(None)
        if self.proc is not None:
            self.proc.wait()

    def live_groups(self) -> list[int]:
        """The process groups of the children that have not ended and still are theirs (the same start
        time; or no leader left, only members of the group)."""
        return [pgid for index, pgid in self.running().items() if start_time(pgid) in (self.starts.get(index), 0)]

    def kill_children(self, sig: int = signal.SIGKILL) -> None:
        """Signal each child's process group that is still the child's."""
        for pgid in self.live_groups():
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def native() -> Path | None:
    """The shepherd program (shepherd.c), when it was built; None: shepherd.py."""
    return NATIVE if os.access(NATIVE, os.X_OK) else None


class Started:
    """A shepherd this daemon started itself (its parent: it reaps it)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None:   # (as Popen.wait)
            deadline = time.monotonic() + timeout
            while self.poll() is None:
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(str(NATIVE), timeout)
                time.sleep(0.01)
            return self.returncode
        while self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                status = 0
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def encode_spec(spec: dict) -> bytes:
    """The spec as shepherd.c reads it: NUL-ended fields (see its header)."""
    fields = ["AIRSPEC1", spec["folder"], spec["tag"], spec["events"],
              "" if spec["uid"] is None else spec["uid"], spec["gid"], len(spec["groups"]), *spec["groups"],
              len(spec["cgroups"]), *spec["cgroups"], len(spec["rlimits"])]
    for number, soft in spec["rlimits"]:
        fields += [number, soft]
    fields += [len(spec["holds"]), *spec["holds"], len(spec["children"])]
    for one in spec["children"]:
        command = [str(a) for a in one["argv"]]
        env = [f"{k}={v}" for k, v in one["env"].items()]
        if "\0" in "".join(command) or "\0" in "".join(env):   # (execve would refuse it: the child fails to
            command = env = []                                   # run, exit 126)
        start = one.get("start") or {"cwd": "", "out": "", "err": "", "truncate": False}
        fields += [one["stdout"], one["stderr"], start["cwd"], start["out"], start["err"], int(start["truncate"]),
                   len(command), *command, len(env), *env]
    text = [f if isinstance(f, str) else str(f) for f in fields]
    if "\0" in "".join(text):
        raise ValueError("a NUL byte in a path of the shepherd's spec")
    return os.fsencode("\0".join(text) + "\0")


def _start_native(program: Path, spec: dict, passed: list[int]) -> Started:
    """posix_spawn the shepherd program (no copy of this daemon: it costs a fraction of a millisecond), in a
    session of its own, the spec on its standard input and the passed descriptors placed above all of them."""
    base = max([*passed, 2]) + 1
    place = {fd: base + i for i, fd in enumerate(passed)}
    placed = {**spec, "events": place[spec["events"]],
              "children": [{**one, "stdout": place[one["stdout"]], "stderr": place[one["stderr"]]}
                           for one in spec["children"]]}
    data = encode_spec(placed)
    spec_r, spec_w = os.pipe()
    try:
        actions = [(os.POSIX_SPAWN_DUP2, spec_r, 0), (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
        actions += [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in place.items()]
        pid = os.posix_spawn(str(program), [str(program)], SHEPHERD_ENV, file_actions=actions, setsid=True,
                             setsigmask=())
    except BaseException:
        os.close(spec_w)
        raise
    finally:
        os.close(spec_r)
    started = Started(pid)
    try:
        with open(spec_w, "wb", closefd=True) as pipe:
            pipe.write(data)
    except BaseException:
        started.kill()
        started.wait()
        raise
    return started


class SpawnerGone(OSError):
    """The spawner could not be asked (it never got the request)."""


class Spawner:
    """The node's shepherd spawner (shepherd.py --serve): a single-threaded process that forks each
    shepherd in well under a millisecond, where starting one costs tens of milliseconds of Python.
    It ends with the daemon that started it; the shepherds it forked do not."""

    def __init__(self, spool: Path):
        self.path = spool / "spawner.sock"
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", PROGRAM, "--serve", str(self.path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
                                     cwd="/", env=SHEPHERD_ENV)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise OSError(f"the shepherd spawner did not start (exit {self.proc.poll()})")
            time.sleep(0.005)

    def fork(self, spec: dict, fds: list[int]) -> tuple[int, int]:
        """(pid, start time) of a new shepherd for `spec`."""
        import socket
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(START_TIMEOUT_S)
            try:
                conn.connect(str(self.path))
            except OSError as e:   # nothing was asked: the caller may start the shepherd itself
                raise SpawnerGone(str(e)) from e
            data = json.dumps({**spec, "fds": fds}).encode()
            sent = socket.send_fds(conn, [data[:1 << 16]], fds)
            conn.sendall(data[sent:])
            conn.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := conn.recv(64):
                reply += chunk
        pid, started = (int(x) for x in reply.split())
        return pid, started

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def spawn(folder: Path, tag: str, children: list[Child], uid: int | None, gid: int, groups: list[int],
          cgroup: Path | None, holds: list[Path] = (), spawner: Spawner | None = None,
          rlimits: list[list[int]] = (), named: bool = True) -> Herd:
    """Start a shepherd for `children` (the shepherd program; forked by the spawner, or a Python of its
    own, without it) and wait until each has started (or failed to); the caller closes its own copies
    of the children's descriptors. uid None: run as the daemon's user. named False: its events come
    through a pipe, not the TAG.events FIFO (one file fewer a run: for a shepherd whose children's
    ends are all a daemon that adopts it needs, which it has from the record once the shepherd is
    gone: adopt)."""
    _fresh(folder, tag)
    if named:
        fifo = folder / f"{tag}.events"
        os.mkfifo(fifo, 0o600)
        fd = os.open(fifo, _FIFO_FLAGS)
    else:
        fd, pipe_end = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(fd, False)
    proc = None
    try:
        write_end = os.open(fifo, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC) if named else pipe_end
        try:
            passed = [write_end] + sorted({c.stdout for c in children} | {c.stderr for c in children})
            spec = {"folder": str(folder), "tag": tag, "events": write_end, "holds": [str(h) for h in holds],
                    "cgroup": str(cgroup) if cgroup else "", "uid": uid, "gid": gid, "groups": groups,
                    "cgroups": [str(g) for g in cgroups.joined(cgroup)] if cgroup else [],
                    "rlimits": [list(pair) for pair in rlimits],
                    "children": [{"argv": c.argv, "env": c.env, "stdout": c.stdout, "stderr": c.stderr,
                                  "start": vars(c.start) if c.start else None} for c in children]}
            try:
                if (program := native()) is not None:
                    proc = _start_native(program, spec, passed)
                    pid, started = proc.pid, start_time(proc.pid)
                else:
                    if spawner is None or not spawner.alive():
                        raise SpawnerGone("no spawner")
                    pid, started = spawner.fork(spec, passed)
            except SpawnerGone:
                proc = subprocess.Popen([sys.executable, "-I", "-S", PROGRAM], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, pass_fds=passed, start_new_session=True,
                                        cwd="/", env=SHEPHERD_ENV)
                pid, started = proc.pid, start_time(proc.pid)
                try:
                    proc.stdin.write(json.dumps(spec).encode() + b"\n")
                    proc.stdin.close()
                except BaseException:
                    proc.kill()
                    proc.wait()
                    raise
        finally:
            os.close(write_end)
    except BaseException:
        os.close(fd)
        raise
    herd = Herd(folder, tag, pid, started, fd, proc)
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(herd.pids.keys() | herd.exits.keys()) < len(children) and not herd.ended:
        left = deadline - time.monotonic()
        if left <= 0:
            herd.kill_children()
            if proc is not None:
                proc.kill()
            else:
                _kill(pid, started)
            herd.wait()
            raise OSError(f"the shepherd of {folder.name}/{tag} did not start its processes in {START_TIMEOUT_S:.0f} s")
        herd.read(left)
    return herd


def _kill(pid: int, started: int) -> None:
    if start_time(pid) == started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def adopt(folder: Path, tag: str) -> Herd:
    """The shepherd an earlier daemon started for `tag` in this folder, with its events so far; ended
    (and with the exits its record holds) when it is no longer running."""
    pid, started, this_boot = _shepherd_of(folder, tag)
    fd, by_process = -1, False
    if this_boot and pid > 1 and start_time(pid) == started:
        try:
            fd = os.open(folder / f"{tag}.events", _FIFO_FLAGS)
            if not stat.S_ISFIFO(os.fstat(fd).st_mode) or os.fstat(fd).st_uid != os.geteuid():
                os.close(fd)
                fd = -1
        except FileNotFoundError:   # a batch script's shepherd, whose events came through a pipe (spawn, named
            by_process = tag == BATCH   # False): followed by its process and its record, a second at most behind
        except OSError:
            fd = -1
    herd = Herd(folder, tag, pid, started, fd, this_boot=this_boot)
    herd._take(herd.record() + b"\n")
    if (fd < 0 and not by_process) or not herd.alive():
        herd._end()
    return herd


def live_groups(folder: Path) -> list[int]:
    """The process groups of every shepherd's children in a run's folder that have not ended and
    still are those children (the same start time), from the records alone: for the fence keeper."""
    out = []
    for tag in tags(folder):
        herd = Herd(folder, tag, 0, 0, -1, this_boot=_shepherd_of(folder, tag)[2])
        herd._take(herd.record() + b"\n")
        out += herd.live_groups()
    return out


def _shepherd_of(folder: Path, tag: str) -> tuple[int, int, bool]:
    """(pid, start time, whether it is of this boot) of the shepherd its record's first line names
    (or TAG.shepherd, an earlier version's). One that cannot be read (put in place whole before the
    shepherd starts anything, so cut short only by a crash of the host, which is a new boot) is taken
    as another boot's: its processes are gone and nothing is signalled under their numbers. A line without a boot id (an
    earlier daemon's) is taken as this boot's."""
    try:
        try:
            fields = jobfiles.read_root_file(folder, f"{tag}.shepherd", 128).split()
        except FileNotFoundError:
            first = _record_head(folder, tag)[0].split()
            fields = first[1:] if first[:1] == [b"shepherd"] else []
        pid, started = int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError, jobfiles.UnsafeFile):
        return 0, 0, False
    return pid, started, len(fields) < 3 or fields[2].decode("ascii", "replace") == boot_id()


def _record_head(folder: Path, tag: str) -> list[bytes]:
    """The lines at the head of TAG.record, the last one maybe cut short: the shepherd's own line, then
    the cgroup its children join (if any), then its first events."""
    return jobfiles.read_root_file(folder, f"{tag}.record", 8192, head=True).split(b"\n")


def recorded_group(folder: Path) -> bytes:
    """The cgroup the shepherds' records in a run's folder name ("cgroup PATH", a record's second line,
    whole): the batch script's first, which steps on its node join too; b"" when none does."""
    for tag in sorted(tags(folder), key=lambda t: t != BATCH):
        try:
            lines = _record_head(folder, tag)
        except (OSError, jobfiles.UnsafeFile):
            continue
        if len(lines) > 2 and lines[1].startswith(b"cgroup "):   # (a whole line, not one cut short)
            return lines[1][len(b"cgroup "):]
    return b""


def tags(folder: Path) -> list[str]:
    """The shepherds started in a run's folder (by their records; an earlier version's by TAG.shepherd)."""
    try:
        names = [e.name for e in os.scandir(folder) if not e.name.startswith(".")]
    except OSError:
        return []
    return sorted({name.rsplit(".", 1)[0] for name in names if name.endswith((".record", ".shepherd"))})


def _fresh(folder: Path, tag: str) -> None:
    for suffix in (".events", ".record", ".shepherd"):
        try:
            os.unlink(folder / f"{tag}{suffix}")
        except FileNotFoundError:
            pass


def make_fifo(folder: Path, name: str) -> tuple[int, int]:
    """A FIFO in the run's folder for a child's output: (read end for the daemon, write end for the child)."""
    path = folder / name
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.mkfifo(path, 0o600)
    r = os.open(path, _FIFO_FLAGS)
    w = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return r, w


def open_fifo(folder: Path, name: str) -> int:
    """A child's output FIFO, opened again by a daemon that adopts its shepherd (-1 when gone)."""
    try:
        fd = os.open(folder / name, _FIFO_FLAGS)
    except OSError:
        return -1
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        return -1
    return fd
