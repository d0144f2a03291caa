"""airctld: load the configuration, open the store, serve gRPC, run the controller loop."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sqlite3
import sys
import threading
from concurrent import futures

import grpc

from air.protos import config as configuration
from air.airctld import retention, store_file
from air.airctld.controller import RPC_WORKERS, Controller
from air.airctld.metrics import StateCollector
from air.airctld.nodes import NodeClients
from air.protos.sdnotify import notify
from air.airctld.service import handlers
from air.airctld.errors import StoreFailed
from air.airctld.store import SCHEMA_VERSION, Store, StoreError
from air.protos import metrics_http


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="airctld", description="AIR controller daemon")
    parser.add_argument("--config", help="air.toml (default: $AIR_CONF, else /etc/air/air.toml)")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", metavar="{store}")
    store_cmd = sub.add_parser("store", help="back up or check the store (aircontrol store ...)")
    ops = store_cmd.add_subparsers(dest="op", required=True)
    backup_cmd = ops.add_parser("backup", help="copy the store while the controller runs")
    backup_cmd.add_argument("path", help="a file, or a folder to hold air-<UTC time>.db")
    restore_cmd = ops.add_parser("restore", help="put a backup in the store's place (airctld stopped)")
    restore_cmd.add_argument("backup")
    check_cmd = ops.add_parser("check", help="integrity check and schema version")
    check_cmd.add_argument("--quick", action="store_true", help="skip comparing indexes with their tables")
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
    db_path = os.path.join(cc.state_dir, "air.db")
    if args.command == "store":
        return store_command(args, db_path)
    if cc.auth == "none":
        if not configuration.is_loopback(cc.host):
            print(f"airctld: error: auth = \"none\" is allowed only on a loopback address, "
                  f"not {cc.address}; configure MUNGE authentication", file=sys.stderr)
            return 2
        log.warning("auth = \"none\": callers state their own uid; for a single-machine cluster only")
    try:
        held = store_file.lock(cc.state_dir)   # (kept open, and locked, until the process exits)
    except (store_file.StoreFileError, OSError) as e:
        print(f"airctld: error: {e}", file=sys.stderr)
        return 2
    left = store_file.interrupted_restore(db_path)
    if left:   # never a new, empty store where one was: job ids would start again at 1
        print(f"airctld: error: no store at {db_path}, but {left} was replaced by a restore that did not "
              f"finish; run aircontrol store restore again (docs/deploy.md, 'Backups')", file=sys.stderr)
        return 2
    notify(f"STATUS=checking the store {db_path}")
    damage = store_file.damage(db_path)
    if damage:
        print(f"airctld: error: the store {db_path} is damaged ({'; '.join(damage[:3])}); restore it "
              f"from a backup (docs/deploy.md, 'Backups')", file=sys.stderr)
        return 2
    try:
        os.makedirs(cc.state_dir, exist_ok=True)
        store = Store(db_path)
    except (OSError, StoreError, StoreFailed, sqlite3.Error) as e:
        print(f"airctld: error: cannot open the store in {cc.state_dir}: {e}", file=sys.stderr)
        return 2
    try:
        auth = cc.authenticator()
        cc.service_uid()
    except Exception as e:  # ConfigError, or libmunge missing
        print(f"airctld: error: {e}", file=sys.stderr)
        return 2
    controller = Controller(cfg, store, clients=NodeClients(cfg, auth))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=RPC_WORKERS), options=[
        ("grpc.max_send_message_length", -1),  # listings of 100,000 jobs run past any request limit
        ("grpc.max_receive_message_length", cc.max_message_bytes),
        ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers(handlers(controller, auth))
    try:
        bound = server.add_insecure_port(cc.address)
    except RuntimeError as e:   # (grpcio raises for an address it cannot read, and returns 0 for one it cannot bind)
        bound, why = 0, f": {e}"
    else:
        why = ""
    if bound == 0:
        print(f"airctld: error: cannot listen on {cc.address}{why}", file=sys.stderr)
        return 2
    if cc.metrics_address:
        host, port = metrics_http.split_address(cc.metrics_address)
        controller.metrics.registry.register(StateCollector(controller, cc.metrics_user_labels))
        try:
            metrics_http.serve(host, port, controller.metrics.registry)
        except OSError as e:
            print(f"airctld: error: cannot serve metrics on {cc.metrics_address}: {e.strerror}", file=sys.stderr)
            return 2
        log.info("metrics on http://%s/metrics", cc.metrics_address)
    maintenance = retention.Maintenance(store, retention.limits(cc), on_pass=controller.metrics.retained)
    maintenance.start()
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
    maintenance.stop()
    controller.stop()
    server.stop(grace=2).wait()
    maintenance.stop(wait_s=10)   # (a pass or a tick in progress finishes with the store, before it closes)
    loop.join(10)
    store.close()
    os.close(held)
    leave(0)


def leave(code: int) -> None:
    """Everything is stopped and written: exit without the interpreter's finalization, during which
    grpc's polling threads can crash the process (SIGSEGV, grpc/grpc#11804) and turn a clean stop into
    a failed one."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def store_command(args, db_path: str) -> int:
    """airctld store backup PATH | check: one summary line, or one error line and exit 1."""
    try:
        if args.op == "backup":
            report, took = store_file.backup(db_path, args.path)
            print(f"{report.path}: a backup of {db_path}, {report.jobs} jobs ({report.active_jobs} not ended), "
                  f"schema {report.schema}, {report.size_bytes / 1e6:.1f} MB, integrity ok, copied in {took:.2f} s")
            return 0
        if args.op == "restore":
            held = store_file.lock(os.path.dirname(db_path))
            try:
                report, next_id, aside = store_file.restore(args.backup, db_path, SCHEMA_VERSION)
            finally:
                os.close(held)
            print(f"{db_path}: restored from {args.backup}: {report.jobs} jobs ({report.active_jobs} not ended), "
                  f"schema {report.schema}, integrity ok; new jobs get ids from {next_id}"
                  + (f"; the store it replaced is {aside}" if aside else ""))
            return 0
        report = store_file.check(db_path, quick=args.quick)
    except (store_file.StoreFileError, OSError, sqlite3.Error) as e:
        print(f"airctld: error: {e}", file=sys.stderr)
        return 1
    known = ("this airctld's" if report.schema == SCHEMA_VERSION else
             f"this airctld knows {SCHEMA_VERSION}; it upgrades on start" if report.schema < SCHEMA_VERSION else
             f"NEWER than this airctld's {SCHEMA_VERSION}: run a newer airctld")
    if not report.sound:
        print(f"{db_path}: DAMAGED: {'; '.join(report.problems[:10])}", file=sys.stderr)
        print("restore the newest good backup (docs/deploy.md, 'Backups')", file=sys.stderr)
        return 1
    print(f"{db_path}: integrity ok ({'quick_check' if args.quick else 'integrity_check'}), schema {report.schema} "
          f"({known}), {report.jobs} jobs ({report.active_jobs} not ended), {report.size_bytes / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
