"""A real local cluster for integration tests: airctld and airnoded processes on loopback addresses.

Each cluster gets a block of loopback addresses of its own, 127.0.N.0/24, reserved for as long as
it lives (`Block`): clusters of one test run, of two runs at once (two
checkouts, CI beside a developer) or of a benchmark (bench/harness.py reserves its blocks here too)
never share an address or a port. Commands run
as real subprocesses of the installed tools.
"""
from __future__ import annotations

import json
import os
import pwd
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from air.protos.states import JobPhase

BIN = Path(sys.executable).parent
BLOCKS = range(100, 250)   # 127.0.N.0/24 blocks that tests and benchmarks take


class Block:
    """A reserved block of loopback addresses, 127.0.N.0/24, until release(). The reservation is an
    abstract Unix socket named for the block (no file a user could plant or link): bound by one
    process at a time, and let go by the kernel when its holder exits, however it exits."""

    def __init__(self, start: int | None = None):
        first = random.randrange(len(BLOCKS)) if start is None else start
        for i in range(len(BLOCKS)):
            n = BLOCKS[(first + i) % len(BLOCKS)]
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(f"\0air-test-block-127.0.{n}")
            except OSError:
                sock.close()
                continue
            self.index, self.prefix, self._sock = (first + i) % len(BLOCKS), f"127.0.{n}", sock
            return
        raise RuntimeError(f"every loopback block 127.0.{BLOCKS[0]}-{BLOCKS[-1]}.0/24 is taken by other tests")

    def address(self, host: int) -> str:
        return f"{self.prefix}.{host}"

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def devices_cgroup() -> bool:
    """Whether node daemons on this host keep each job to its GPUs with a devices cgroup (v1, as root):
    then CUDA numbers a job's GPUs from 0 (CUDA_VISIBLE_DEVICES), and SLURM_JOB_GPUS has the node's."""
    from air.airnoded.cgroups import detect
    return detect() == "v1" and Path("/sys/fs/cgroup/devices/devices.deny").exists()


def free_port() -> int:
    """A TCP port free on this host now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def job_processes(spool: Path, job_ids: list | None, node: str | None = None) -> list[psutil.Process]:
    """The live processes of these jobs (None: of every job) of the cluster whose spool folder is
    `spool` (on `node` only, if given), found by their environment: the job's id, and the stop-reason
    file their node daemon gives them, in that spool (another cluster on this host numbers its jobs
    from 1 and names its nodes node01... too)."""
    return [p for p, _ in job_process_envs(spool, job_ids, node)]


def job_process_envs(spool: Path, job_ids: list | None, node: str | None = None) \
        -> list[tuple[psutil.Process, dict]]:
    """job_processes, each with its environment as it was read to find it."""
    wanted = None if job_ids is None else {str(j) for j in job_ids}
    prefixes = spool_prefixes(spool, node)
    found = []
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if (wanted is None or env.get("AIR_JOB_ID") in wanted) and in_spool(env, prefixes) \
                    and p.status() != psutil.STATUS_ZOMBIE:
                found.append((p, env))
        except (psutil.Error, OSError):
            continue
    return found


def spool_prefixes(spool: Path, node: str | None = None) -> tuple[str, ...]:
    """What the stop-reason files of the spool's runs (on `node`'s folder, if given) begin with: the
    spool's path as given, and resolved (the daemon writes the one its configuration names)."""
    tail = f"/{node}/" if node else "/"
    return tuple({f"{spool}{tail}", f"{os.path.realpath(spool)}{tail}"})


def in_spool(env: dict, prefixes: tuple[str, ...]) -> bool:
    """Whether a process's stop-reason file is in the spool of `prefixes` (spool_prefixes). Compared as
    text, never looked up: the path is the job's to set, and could lead into a mount that never answers."""
    return env.get("AIR_STOP_REASON_FILE", "").startswith(prefixes)


# airrun's own allocations end this long after airrun stops renewing them (short, so that tests see it;
# every airrun outside a job in the tests renews its allocation through it)
INACTIVE_LIMIT = 6.0


class LocalCluster:
    """airctld on 127.0.N.1:6817 and node0K's airnoded on 127.0.N.(K+1):6818, N from a reserved block."""

    def __init__(self, nodes: int = 2, gpus_per_node: int = 4, node_timeout: float = 6.0,
                 options: tuple[str, ...] = (), extra_config: str = "", wrap: tuple[str, ...] = ()):
        self.block = Block()
        self.base_address = self.block.address(1)
        self.options = options
        self.extra_config = extra_config
        self.wrap = wrap   # a command the daemons start under (and so their jobs): unshare -m ..., say
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.node_timeout = node_timeout
        self.root = Path(tempfile.mkdtemp(prefix="air-test-"))
        os.chmod(self.root, 0o755)
        self.dir = self.root / "cluster"
        self.work = self.root / "work"      # a submit directory every user may write
        self.work.mkdir()
        os.chmod(self.work, 0o1777)
        self.config = self.dir / "air.toml"

    # ------------------------------------------------------------ lifecycle

    def up(self) -> "LocalCluster":
        extra = []
        if self.extra_config:
            (self.root / "extra.toml").write_text(self.extra_config)
            extra = ["--extra-config", str(self.root / "extra.toml")]
        try:
            self.cli("aircontrol", "local", "up", "--dir", str(self.dir), "--nodes", str(self.nodes),
                     "--gpus-per-node", str(self.gpus_per_node), "--base-address", self.base_address,
                     "--node-timeout", str(self.node_timeout), "--inactive-limit", str(INACTIVE_LIMIT),
                     *self.options, *extra, env_conf=False, prefix=self.wrap)
        except BaseException:
            self.down()   # (what did start, and the block)
            raise
        return self

    def down(self) -> None:
        try:
            if (self.dir / "pids").exists():
                self.cli("aircontrol", "local", "down", "--dir", str(self.dir), env_conf=False, check=False)
            shutil.rmtree(self.root, ignore_errors=True)
        finally:
            self.block.release()

    @property
    def controller(self) -> str:
        """The controller's host:port."""
        return f"{self.base_address}:6817"

    def node(self, index: int) -> str:
        """node0<index+1>'s daemon, host:port."""
        return f"{self.block.address(2 + index)}:6818"

    def host(self, index: int) -> str:
        """node0<index+1>'s address."""
        return self.block.address(2 + index)

    @property
    def pids(self) -> list[int]:
        return [int(p) for p in (self.dir / "pids").read_text().split()]

    def kill_controller(self) -> None:
        os.kill(self.pids[0], signal.SIGKILL)
        _reap(self.pids[0])

    def start_controller(self) -> None:
        log = open(self.dir / "log" / "airctld.log", "ab")
        proc = subprocess.Popen([sys.executable, "-P", "-m", "air.airctld", "--config", str(self.config)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        pids = self.pids
        pids[0] = proc.pid
        (self.dir / "pids").write_text("\n".join(map(str, pids)) + "\n")
        wait_for(lambda: self.cli("airinfo", check=False).returncode == 0, what="airctld to answer")

    def kill_node(self, index: int, sig: int = signal.SIGKILL) -> int:
        pid = self.pids[1 + index]
        os.kill(pid, sig)
        _reap(pid)
        return pid

    def crash_host(self, index: int, job_ids: list[int]) -> None:
        """What a host crash does to these jobs on node0<index+1>: its daemon, their processes there and
        the shepherds that watch them all die at once, so nothing there can say how the runs ended. The
        shepherds go first (a shepherd that outlived its child by a moment would record the child's
        end); scans again until no such process is left (a rank may be starting as the scan runs)."""
        name = f"node{index + 1:02d}"
        self.kill_node(index)
        deadline = time.monotonic() + 10
        first = True
        while True:
            shepherds, victims = set(), set()
            for p in self.job_processes(job_ids, name):
                victims.add(p)
                try:
                    parent = p.parent()
                    if parent is not None and "shepherd" in " ".join(parent.cmdline()):
                        shepherds.add(parent)
                except (psutil.Error, OSError):
                    continue
            assert victims or not first, f"no process of jobs {sorted(job_ids)} on {name} to crash"
            if not victims:
                return
            first = False
            assert time.monotonic() < deadline, f"processes of jobs {sorted(job_ids)} on {name} outlive SIGKILL"
            for group in (shepherds, victims):
                for p in group:
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
            psutil.wait_procs(list(shepherds | victims), timeout=2)

    def job_processes(self, job_ids: list[int], node: str | None = None) -> list[psutil.Process]:
        """The live processes of these jobs of this cluster (on `node` only, if given)."""
        return job_processes(self.dir / "spool", job_ids, node)

    def job_process_envs(self, job_ids: list[int], node: str | None = None) -> list[tuple[psutil.Process, dict]]:
        """job_process_envs of this cluster's spool."""
        return job_process_envs(self.dir / "spool", job_ids, node)

    def start_node(self, index: int) -> int:
        """Start node0<index+1>'s daemon again (after kill_node), as its unit would."""
        name = f"node{index + 1:02d}"
        log = open(self.dir / "log" / f"{name}.log", "ab")
        proc = subprocess.Popen([sys.executable, "-P", "-m", "air.airnoded", "--config", str(self.config), "--name", name],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        pids = self.pids
        pids[1 + index] = proc.pid
        (self.dir / "pids").write_text("\n".join(map(str, pids)) + "\n")
        return proc.pid

    # ------------------------------------------------------------ commands

    def cli(self, tool: str, *args: str, check: bool = True, user: str | None = None,
            cwd: Path | None = None, env_conf: bool = True, timeout: float = 60,
            env: dict | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        # as a user who has AIR's tools (and this Python) first on PATH; jobs inherit it
        full_env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        full_env.update(env or {})
        if env_conf:
            full_env["AIR_CONF"] = str(self.config)
        as_user = {}
        if user:  # become the user whole: uid, primary group, and no groups of ours
            entry = pwd.getpwnam(user)
            as_user = dict(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
        proc = subprocess.run([*prefix, str(BIN / tool), *args], capture_output=True, text=True, timeout=timeout,
                              cwd=str(cwd or self.work), env=full_env, **as_user)
        if check and proc.returncode != 0:
            raise AssertionError(f"{tool} {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def slurm_commands(self, folder: Path) -> dict:
        """Slurm's command names installed into `folder`; an environment with them first on PATH."""
        folder.mkdir(exist_ok=True)
        self.cli("aircontrol", "slurm-commands", "install", "--dir", str(folder))
        return dict(os.environ, AIR_CONF=str(self.config), PATH=f"{folder}:{BIN}:{os.environ.get('PATH', '')}")

    def write_script(self, name: str, text: str, mode: int = 0o644) -> Path:
        path = self.work / name
        path.write_text(text)
        os.chmod(path, mode)
        return path

    def submit(self, script: Path | str, *options: str, user: str | None = None, env: dict | None = None) -> int:
        out = self.cli("airbatch", "--parsable", *options, str(script), user=user, env=env).stdout
        return int(out.strip())

    def job(self, job_id: int) -> dict:
        return json.loads(self.cli("aircontrol", "show", "job", str(job_id), "--json").stdout)

    def wait_state(self, job_id: int, *states: str, timeout: float = 20.0) -> dict:
        return wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout=timeout,
                        what=f"job {job_id} to reach {'/'.join(states)}")

    def queue(self, *args: str) -> list[dict]:
        return json.loads(self.cli("airq", "--json", *args).stdout)["jobs"]

    def db_rows(self) -> tuple[int, int]:
        """(jobs, events) rows in the store, read straight from the SQLite file, once no job is
        completing: a job an earlier test cancelled writes its last event when its node reports
        the end, which may come while a later test checks that its request changed nothing."""
        conn = sqlite3.connect(self.dir / "state" / "air.db")
        try:
            completing = "SELECT count(*) FROM jobs WHERE phase = ?", (int(JobPhase.COMPLETING),)
            wait_for(lambda: not conn.execute(*completing).fetchone()[0], timeout=30, what="no job completing")
            return (conn.execute("SELECT count(*) FROM jobs").fetchone()[0],
                    conn.execute("SELECT count(*) FROM events").fetchone()[0])
        finally:
            conn.close()


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        wait_for(lambda: not _exists(pid), timeout=10, what=f"pid {pid} to exit")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
