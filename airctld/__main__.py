"""airctld: load the configuration, open the store, serve gRPC, run the controller loop."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from concurrent import futures

import grpc

from airctld import config as configuration
from airctld.controller import Controller
from airctld.nodes import NodeClients
from airctld.sdnotify import notify
from airctld.service import handlers
from airctld.errors import StoreFailed
from airctld.store import Store, StoreError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="airctld", description="AIR controller daemon")
    parser.add_argument("--config", help="air.toml (default: $AIR_CONF, else /etc/air/air.toml)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s airctld %(levelname)s %(message)s")
    log = logging.getLogger("airctld")
    try:
        cfg = configuration.load(args.config)
    except configuration.ConfigError as e:
        print(f"airctld: error: {e}", file=sys.stderr)
        return 2
    cc = cfg.controller
    if cc.auth == "none":
        if not configuration.is_loopback(cc.host):
            print(f"airctld: error: auth = \"none\" is allowed only on a loopback address, "
                  f"not {cc.address}; configure MUNGE authentication", file=sys.stderr)
            return 2
        log.warning("auth = \"none\": callers state their own uid; for a single-machine cluster only")
    try:
        os.makedirs(cc.state_dir, exist_ok=True)
        store = Store(os.path.join(cc.state_dir, "air.db"))
    except (OSError, StoreError, StoreFailed) as e:
        print(f"airctld: error: cannot open the store in {cc.state_dir}: {e}", file=sys.stderr)
        return 2
    try:
        auth = cc.authenticator()
        cc.service_uid()
    except Exception as e:  # ConfigError, or libmunge missing
        print(f"airctld: error: {e}", file=sys.stderr)
        return 2
    controller = Controller(cfg, store, clients=NodeClients(cfg, auth))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=[
        ("grpc.max_send_message_length", -1),  # listings of 100,000 jobs run past any request limit
        ("grpc.max_receive_message_length", cc.max_message_bytes),
        ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers(handlers(controller, auth))
    if server.add_insecure_port(cc.address) == 0:
        print(f"airctld: error: cannot listen on {cc.address}", file=sys.stderr)
        return 2
    server.start()
    loop = threading.Thread(target=controller.run, name="controller", daemon=True)
    loop.start()
    log.info("serving on %s, store %s, %d jobs in memory", cc.address, cc.state_dir, len(controller.jobs))
    notify(f"READY=1\nSTATUS=serving on {cc.address}")
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("shutting down")
    notify("STOPPING=1")
    controller.stop()
    server.stop(grace=2).wait()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
