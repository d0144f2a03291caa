"""A whole AIR cluster on this machine: one airctld and N airnoded, each node on its own loopback address."""
from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from air.aircli.client import CliError
from air.protos.limits import is_number

CONTROLLER_PORT = 6817
NODE_PORT = 6818
CONTROLLER_METRICS_PORT = 9817   # Prometheus /metrics, on the controller's address
NODE_METRICS_PORT = 9818         # and on each node's


def write_config(directory: Path, nodes: int, gpus_per_node: int, cpus_per_node: int,
                 base_address: str, node_timeout_s: float, auth: str = "none", munge_socket: str = "",
                 extra: str = "", operators: tuple = (), private_jobs: bool = False,
                 health_program: str = "", max_gpu_temp_c: int = 85, health_auto_resume: bool = False,
                 heartbeat_s: float = 0.0, inactive_limit_s: float = 60.0,
                 unkillable_timeout_s: float = 60.0, gpus: str = "") -> Path:
    """`gpus`: the nodes' GPU backend (the config's `gpus`), simulated ones (sim:gpus_per_node) unless given."""
    base = ipaddress.ip_address(base_address)
    if not base.is_loopback:
        raise CliError(f"--base-address {base_address} is not a loopback address")
    first, last = base + 1, base + nodes
    if not last.is_loopback:
        raise CliError(f"{nodes} nodes after {base_address} run past the loopback range")
    prefix = str(first).rsplit(".", 1)[0]
    if str(last).rsplit(".", 1)[0] != prefix:
        raise CliError(f"{nodes} nodes after {base_address} do not fit in one /24; pick a lower base address")
    names = f"node[01-{nodes:02d}]" if nodes > 1 else "node01"
    addresses = f"{prefix}.[{str(first).rsplit('.', 1)[1]}-{str(last).rsplit('.', 1)[1]}]" if nodes > 1 else str(first)
    text = f"""# A local AIR cluster, written by `aircontrol local up`.
[controller]
address = "{base}:{CONTROLLER_PORT}"
state_dir = "{directory / 'state'}"
auth = "{auth}"
munge_socket = "{munge_socket}"
operators = [{", ".join(f'"{o}"' for o in operators)}]
private_jobs = {"true" if private_jobs else "false"}
heartbeat_interval_s = {heartbeat_s or min(1.0, node_timeout_s / 6):g}
node_timeout_s = {node_timeout_s:g}
kill_wait_s = 5
inactive_limit_s = {inactive_limit_s:g}
unkillable_timeout_s = {unkillable_timeout_s:g}
min_job_age_s = 300
max_script_bytes = 1048576
metrics_address = "{base}:{CONTROLLER_METRICS_PORT}"

[[nodes]]
name = "{names}"
address = "{addresses}"
port = {NODE_PORT}
gpus = "{gpus or f'sim:{gpus_per_node}'}"
cpus = {cpus_per_node}
spool_dir = "{directory / 'spool' / '%n'}"
ib_sysfs = "{directory / 'ib' / '%n'}"
health_program = "{health_program}"
health_interval_s = 1.0
max_gpu_temp_c = {max_gpu_temp_c}
health_auto_resume = {"true" if health_auto_resume else "false"}
metrics_port = {NODE_METRICS_PORT}

[[partitions]]
name = "gpu"
nodes = "{names}"
default = true
{extra}"""
    path = directory / "air.toml"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def _spawn(args: list[str], log: Path, env: dict) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    return proc.pid


def up(directory: Path, nodes: int, gpus_per_node: int, cpus_per_node: int, base_address: str,
       node_timeout_s: float, wait_s: float = 60.0, auth: str = "none", munge_socket: str = "",
       extra: str = "", operators: tuple = (), private_jobs: bool = False, health_program: str = "",
       max_gpu_temp_c: int = 85, health_auto_resume: bool = False, heartbeat_s: float = 0.0,
       inactive_limit_s: float = 60.0, unkillable_timeout_s: float = 60.0, gpus: str = "") -> Path:
    directory = directory.resolve()
    (directory / "log").mkdir(parents=True, exist_ok=True)
    pids_file = directory / "pids"
    if pids_file.exists() and any(_alive(p) for p in _pids(pids_file)):
        raise CliError(f"a local cluster is already running in {directory}; run aircontrol local down first")
    config = write_config(directory, nodes, gpus_per_node, cpus_per_node, base_address, node_timeout_s,
                          auth, munge_socket, extra, operators, private_jobs, health_program, max_gpu_temp_c,
                          health_auto_resume, heartbeat_s, inactive_limit_s, unkillable_timeout_s, gpus)
    from air.protos.config import load
    cfg = load(str(config))
    _check_free(cfg)
    env = dict(os.environ, AIR_CONF=str(config))
    pids = [_spawn([sys.executable, "-P", "-m", "air.airctld", "--config", str(config)], directory / "log" / "airctld.log", env)]
    for node in cfg.nodes:
        pids.append(_spawn([sys.executable, "-P", "-m", "air.airnoded", "--config", str(config), "--name", node.name],
                           directory / "log" / f"{node.name}.log", env))
    pids_file.write_text("\n".join(map(str, pids)) + "\n")
    _wait_idle(config, len(cfg.nodes), pids, directory, wait_s)
    return config


def _check_free(cfg) -> None:
    """Refuse to start where something already listens (another local cluster, from another folder):
    its controller would answer for this one's, which fails to start."""
    import socket
    from air.protos import metrics_http
    wanted = [metrics_http.split_address(cfg.controller.address)]
    if cfg.controller.metrics_address:
        wanted.append(metrics_http.split_address(cfg.controller.metrics_address))
    for node in cfg.nodes:
        wanted.append(metrics_http.split_address(node.endpoint))
        if node.metrics_port:
            wanted.append((node.address, node.metrics_port))
    for host, port in wanted:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # (a closed connection's TIME_WAIT is no user)
            try:
                s.bind((host, port))
            except OSError as e:
                raise CliError(f"{host}:{port} is taken ({e.strerror}): is another local cluster running? "
                               f"Stop it (aircontrol local down --dir ITS_FOLDER) or give --base-address") from None


def metrics_urls(config: Path) -> list[str]:
    """Where the local cluster's daemons serve /metrics: the controller's first."""
    from air.protos.config import load
    cfg = load(str(config))
    urls = [f"http://{cfg.controller.metrics_address}/metrics"] if cfg.controller.metrics_address else []
    return urls + [f"http://{n.address}:{n.metrics_port}/metrics" for n in cfg.nodes if n.metrics_port]


def _wait_idle(config: Path, count: int, pids: list[int], directory: Path, wait_s: float) -> None:
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    client = Client(str(config))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        dead = [p for p in pids if not _alive(p)]
        if dead:
            down(directory)
            raise CliError(f"a daemon of the local cluster exited at start; see {directory / 'log'}")
        try:
            reply = client.list_nodes(pb.ListNodesRequest(), timeout=2)
            if sum(n.state == pb.NODE_STATE_UP for n in reply.nodes) == count:
                return
        except CliError:
            pass
        time.sleep(0.1)
    down(directory)
    raise CliError(f"the local cluster did not come up within {wait_s:g} s; see {directory / 'log'}")


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split() if is_number(x)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process counts as gone
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        pass
    try:  # and so does another process's zombie (a daemon a test restarted ends as its child)
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def down(directory: Path, wait_s: float = 10.0) -> int:
    """Stop the daemons (nodes first), then kill what jobs they leave running (a node daemon that stops
    leaves its jobs to the next one; this cluster has no next one); returns how many daemons ran."""
    pids_file = directory.resolve() / "pids"
    if not pids_file.exists():
        raise CliError(f"no local cluster in {directory} (no pids file)")
    pids = [p for p in reversed(_pids(pids_file)) if _alive(p)]
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    pids_file.unlink()
    spool_root = directory.resolve() / "spool"
    _stop_fence_keepers(spool_root)
    for spool in sorted(spool_root.iterdir()) if spool_root.is_dir() else ():
        if spool.is_dir():
            subprocess.run([sys.executable, "-P", "-m", "air.airnoded.fence", "--kill-runs", str(spool)],
                           stdin=subprocess.DEVNULL, check=False)
    return len(pids)


def _stop_fence_keepers(spool_root: Path) -> None:
    """Each node's fence keeper outlives its daemon on purpose; a local cluster taken down stops them."""
    if not spool_root.is_dir():
        return
    for pid_file in spool_root.glob("*/fence.pid"):
        try:
            pid = int(pid_file.read_text())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"airnoded.fence" in f.read():
                    os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            continue
