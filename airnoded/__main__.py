"""airnoded: find this node in the configuration, take its GPU inventory, serve NodeAgent, heartbeat."""
from __future__ import annotations

import os

# gRPC's fork handlers, run in the child of every job this daemon forks while gRPC threads are
# busy, crash that child now and then (SIGSEGV before exec). The daemon never uses gRPC in a
# child, so it turns them off before grpc is imported.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"

import argparse  # noqa: E402
import fcntl
import logging
import signal
import socket
import sys
import threading
from concurrent import futures

import grpc

from air.protos import config as configuration
from air.protos.sdnotify import notify
from air.airnoded.agent import Agent, AgentService
from air.airnoded.metrics import NodeCollector
from air.airnoded.gpus import GpuError, open_backend
from air.airnoded import fence
from air.airnoded.jobfiles import check_spool, spread_runs
from air.protos import air_pb2_grpc as rpc
from air.protos import metrics_http


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="airnoded", description="AIR node daemon")
    parser.add_argument("--config", help="air.toml (default: $AIR_CONF, else /etc/air/air.toml)")
    parser.add_argument("--name", help="this node's name in the configuration (default: the short host name)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    name = args.name or socket.gethostname().split(".")[0]
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format=f"%(asctime)s airnoded[{name}] %(levelname)s %(message)s")
    try:
        cfg = configuration.load(args.config)
    except configuration.ConfigError as e:
        print(f"airnoded: error: {e}", file=sys.stderr)
        return 2
    node = cfg.node(name)
    if node is None:
        print(f"airnoded: error: node {name} is not in {cfg.path}; pass --name", file=sys.stderr)
        return 2
    try:
        gpus = open_backend(node.gpus, node.name)
        node.spool.mkdir(parents=True, exist_ok=True)
        check_spool(node.spool)
        spread_runs(node.spool)   # (a hint to the filesystem: never a reason not to start)
    except (GpuError, OSError) as e:
        print(f"airnoded: error: {e}", file=sys.stderr)
        return 2
    if cfg.controller.auth == "none" and not configuration.is_loopback(node.address):
        print(f"airnoded: error: auth = \"none\" is allowed only on loopback addresses, not {node.address}; "
              "configure MUNGE authentication", file=sys.stderr)
        return 2
    try:
        auth = cfg.controller.authenticator()
        cfg.controller.service_uid()
    except Exception as e:  # ConfigError, or libmunge missing
        print(f"airnoded: error: {e}", file=sys.stderr)
        return 2
    try:   # one daemon per spool: a second would adopt (and kill) what the first watches
        lock = os.open(node.spool / "airnoded.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        print(f"airnoded: error: another airnoded runs on spool {node.spool} ({e.strerror})", file=sys.stderr)
        return 2
    agent = Agent(cfg, node, gpus, auth)
    try:   # before the keeper is replaced and before any heartbeat: the runs an earlier daemon left
        agent.adopt()
    except Exception as e:   # what an earlier daemon left must never keep this one from starting
        logging.getLogger("airnoded").exception("adopting what an earlier airnoded left failed: %s", e)
    agent.start_spawner()
    # the keeper acts a little after the daemon would, so that a live daemon fences (and says so) itself
    later = min(0.5, cfg.controller.fence_grace_s / 2)
    fence.start(node.spool, cfg.controller.fence_after_s + later, cfg.controller.fence_grace_s - later)
    agent.monitor.start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=128), options=[  # a thread per streaming step (at most steps.MAX_STREAMS)
        ("grpc.max_receive_message_length", cfg.controller.max_message_bytes),
        ("grpc.so_reuseport", 0)])
    rpc.add_NodeAgentServicer_to_server(AgentService(agent), server)
    if server.add_insecure_port(node.endpoint) == 0:
        print(f"airnoded: error: cannot listen on {node.endpoint}", file=sys.stderr)
        return 2
    if node.metrics_port:
        agent.metrics.registry.register(NodeCollector(agent))
        try:
            metrics_http.serve(node.address, node.metrics_port, agent.metrics.registry)
        except OSError as e:
            print(f"airnoded: error: cannot serve metrics on {node.address}:{node.metrics_port}: {e.strerror}",
                  file=sys.stderr)
            return 2
        logging.getLogger("airnoded").info("metrics on http://%s:%d/metrics", node.address, node.metrics_port)
    server.start()
    threading.Thread(target=agent.run, name="agent", daemon=True).start()
    threading.Thread(target=agent.watch_lease, name="lease", daemon=True).start()
    threading.Thread(target=agent.watch_kills, name="kills", daemon=True).start()
    logging.getLogger("airnoded").info("serving on %s with %d GPUs", node.endpoint, len(gpus.inventory()))
    notify(f"READY=1\nSTATUS=serving on {node.endpoint}")
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    notify("STOPPING=1")
    agent.stop()
    server.stop(grace=1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
