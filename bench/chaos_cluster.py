"""The chaos benchmark's cluster: one airctld and N airnoded on this machine, each node a host with a
network of its own, so that one host can be cut off.

Loopback addresses cannot be cut one at a time here: there is no iptables or nft, and a node
daemon's own calls leave from 127.0.0.1 whatever address it listens on, so dropping a node's address
would stop what reaches the node but not its heartbeats. Instead every node daemon (and so every
process it starts) runs in a network namespace of its own, joined by a veth pair to a bridge that
carries the controller's address: cutting a host is taking its link down. All of it lives inside a
private network and mount namespace of the benchmark (`unshare --net --mount`), so nothing touches
the machine's own network and it all vanishes with the benchmark. Off loopback, AIR requires MUNGE:
the cluster has a munged of its own.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SUBNET = "10.77.0"         # private to the benchmark's network namespace
CONTROLLER = f"{SUBNET}.1"
INSIDE = "AIR_CHAOS_NETNS"


def enter_private_namespace(argv: list[str]) -> None:
    """Run this program again inside a network and mount namespace of its own (once)."""
    if os.environ.get(INSIDE) == "1":
        return
    if os.geteuid() != 0:
        sys.exit("bench_chaos: error: network namespaces (the host cut) need root")
    os.environ[INSIDE] = "1"
    os.execvp("unshare", ["unshare", "--net", "--mount", "--propagation", "private", "--",
                          sys.executable, *argv])


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


class Network:
    """A bridge with the controller's address; per node a namespace whose eth0 is on the bridge."""

    def __init__(self, names: list[str]):
        self.names = names
        os.makedirs("/run/netns", exist_ok=True)
        _sh("mount", "-t", "tmpfs", "air-chaos-netns", "/run/netns")   # names private to this namespace
        _sh("ip", "link", "set", "lo", "up")
        _sh("ip", "link", "add", "airbr", "type", "bridge")
        _sh("ip", "addr", "add", f"{CONTROLLER}/24", "dev", "airbr")
        _sh("ip", "link", "set", "airbr", "up")
        for i, name in enumerate(names):
            ns, host = f"air-{name}", f"v{name}"
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "link", "set", host, "master", "airbr")
            _sh("ip", "link", "set", host, "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def address(self, name: str) -> str:
        return f"{SUBNET}.{2 + self.names.index(name)}"

    def enter(self, name: str) -> list[str]:
        """A command prefix that runs in the node's network namespace (and nothing else changed)."""
        return ["nsenter", f"--net=/run/netns/air-{name}", "--"]

    def cut(self, name: str) -> None:
        _sh("ip", "link", "set", f"v{name}", "down")

    def restore(self, name: str) -> None:
        _sh("ip", "link", "set", f"v{name}", "up")


class Munged:
    def __init__(self, folder: Path):
        self.dir = folder
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self.socket = str(folder / "munge.socket")
        _sh("munged", "--force", f"--socket={self.socket}", f"--key-file={key}",
            f"--log-file={folder / 'munged.log'}", f"--pid-file={folder / 'munged.pid'}",
            f"--seed-file={folder / 'munged.seed'}")
        _wait(lambda: os.path.exists(self.socket), 10, "munged's socket")

    def stop(self) -> None:
        try:
            os.kill(int((self.dir / "munged.pid").read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass


def _wait(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


CONFIG = """# The chaos benchmark's cluster (bench/chaos_cluster.py).
[controller]
address = "{controller}:6817"
state_dir = "{dir}/state"
auth = "munge"
munge_socket = "{munge}"
heartbeat_interval_s = {heartbeat:g}
node_timeout_s = {node_timeout:g}
kill_wait_s = 5
min_job_age_s = 3600

[[nodes]]
name = "node[01-{count:02d}]"
address = "{subnet}.[2-{last}]"
port = 6818
gpus = "sim:{gpus}"
cpus = 32
spool_dir = "{dir}/spool/%n"
ib_sysfs = "{dir}/ib/%n"
health_interval_s = 1.0

[[partitions]]
name = "gpu"
nodes = "node[01-{count:02d}]"
default = true

[scheduler]
preempt_grace_s = 30.0

[[qos]]
name = "normal"

[[qos]]
name = "high"
priority = 10
preempt = ["normal"]
"""


class Cluster:
    """The daemons, started and stopped one by one; every program runs this checkout's code."""

    def __init__(self, folder: Path, nodes: int = 3, gpus_per_node: int = 2, node_timeout: float = 10.0,
                 heartbeat: float = 1.0):
        self.dir = folder
        (folder / "log").mkdir(parents=True, exist_ok=True)
        self.names = [f"node{i:02d}" for i in range(1, nodes + 1)]
        self.net = Network(self.names)
        self.munged = Munged(folder / "munge")
        self.config = folder / "air.toml"
        self.config.write_text(CONFIG.format(controller=CONTROLLER, dir=folder, munge=self.munged.socket,
                                             heartbeat=heartbeat, node_timeout=node_timeout, count=nodes,
                                             subnet=SUBNET, last=1 + nodes, gpus=gpus_per_node))
        self.env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                        AIR_CONF=str(self.config), GLOO_SOCKET_IFNAME="eth0",
                        OMP_NUM_THREADS="1")
        for name in ("AIR_JOB_ID", "AIR_RESTART_COUNT", "RANK"):
            self.env.pop(name, None)
        self.pids: dict[str, int] = {}
        self._procs: dict[int, subprocess.Popen] = {}
        self._client = None

    # ------------------------------------------------------------ daemons

    def up(self, wait_s: float = 60.0) -> None:
        self.start_controller()
        for name in self.names:
            self.start_node(name)
        _wait(lambda: all(s in ("idle", "mix", "alloc") for s in self.node_states().values()), wait_s,
              "every node to come up")

    def _spawn(self, key: str, args: list[str]) -> int:
        # `python -m` looks in the working folder first: from another checkout it would run that one's code
        with open(self.dir / "log" / f"{key}.log", "ab") as out:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=self.env, cwd=str(ROOT))
        self._procs[proc.pid] = proc
        self.pids[key] = proc.pid
        # the layout `aircontrol local down` reads: the controller first, then the nodes
        order = ["airctld", *self.names]
        (self.dir / "pids").write_text("".join(f"{self.pids[k]}\n" for k in order if k in self.pids))
        return proc.pid

    def start_controller(self) -> None:
        self._spawn("airctld", [sys.executable, "-m", "air.airctld", "--config", str(self.config)])
        _wait(self._answers, 30, "airctld to answer")

    def start_node(self, name: str) -> int:
        return self._spawn(name, [*self.net.enter(name), sys.executable, "-m", "air.airnoded",
                                  "--config", str(self.config), "--name", name])

    def signal(self, key: str, sig: int) -> None:
        os.kill(self.pids[key], sig)

    def wait_exit(self, key: str, timeout: float) -> bool:
        proc = self._procs[self.pids[key]]
        try:
            proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def down(self) -> None:
        from air.aircli.local import down
        if (self.dir / "pids").exists():
            try:
                down(self.dir)
            except Exception as e:   # never leave the benchmark without saying why
                print(f"bench_chaos: stopping the cluster: {e}", file=sys.stderr)
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.munged.stop()

    # ------------------------------------------------------------ queries (in process: cheap enough to poll)

    @property
    def client(self):
        if self._client is None:
            from air.aircli.client import Client
            self._client = Client(str(self.config))
        return self._client

    def _answers(self) -> bool:
        from air.aircli.client import CliError
        from air.protos import air_pb2 as pb
        try:
            self.client.list_nodes(pb.ListNodesRequest(), timeout=2)
            return True
        except CliError:
            return False

    def job(self, job_id: int) -> dict:
        from air.aircli import formats
        from air.protos import air_pb2 as pb
        return formats.job_json(self.client.get_job(pb.GetJobRequest(job_id=job_id), timeout=5), time.time())

    def node_states(self) -> dict[str, str]:
        from air.aircli import formats
        from air.protos import air_pb2 as pb
        reply = self.client.list_nodes(pb.ListNodesRequest(), timeout=5)
        return {n.name: formats.node_state(n) for n in reply.nodes}

    def cli(self, tool: str, *args: str, check: bool = True) -> str:
        proc = subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, env=self.env,
                              cwd=str(ROOT), timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout
