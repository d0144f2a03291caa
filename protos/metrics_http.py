"""/metrics over HTTP for both daemons: Prometheus's text format from a registry of our own.

One thread, one request at a time, each connection given a few seconds: a scraper that stalls or
trickles, or a host that opens connections by the thousand, costs a daemon one thread (and, while
a connection is open, its deadline's timer) and never more.
"""
from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, disable_created_metrics, generate_latest

CONNECTION_TIMEOUT_S = 5.0    # for each read or write
CONNECTION_DEADLINE_S = 10.0  # for the whole connection: a client that trickles bytes is cut off then


class _Handler(BaseHTTPRequestHandler):
    timeout = CONNECTION_TIMEOUT_S      # per socket operation of one connection
    server_version = "air"

    def handle(self) -> None:
        deadline = threading.Timer(CONNECTION_DEADLINE_S, self._cut)
        deadline.daemon = True
        deadline.start()
        try:
            super().handle()
        finally:
            deadline.cancel()

    def _cut(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_GET(self) -> None:   # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served here")
            return
        try:
            body = generate_latest(self.server.registry)
        except Exception as e:   # a collector that failed: say so, once, to this scrape
            self.send_error(500, f"collecting metrics failed: {type(e).__name__}")
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:   # scrapes every few seconds: not worth a log line
        pass


class _Server(HTTPServer):
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.registry = registry


def serve(host: str, port: int, registry: CollectorRegistry, name: str = "metrics") -> HTTPServer:
    """Serve `registry` at http://host:port/metrics on one daemon thread; OSError if the address is taken."""
    disable_created_metrics()   # (a _created series beside every counter: noise on a dashboard)
    server = _Server((host, port), registry)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


def split_address(text: str) -> tuple[str, int]:
    """"host:port" (IPv6 in brackets) -> (host, port); ValueError for anything else."""
    from air.protos import hostport
    return hostport.split(text, bare_ipv6=True)
