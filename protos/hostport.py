"""host:port as the configuration gives airctld's address, and the tools and daemons use it."""
from __future__ import annotations

from air.protos.limits import is_number


def split(address: str) -> tuple[str, int]:
    """host and port of `host:port`, `[v6]:port`, `dns:///host:port`, `ipv4:host:port` or
    `ipv6:[v6]:port`; ValueError for anything else (a port is a number from 1 to 65535)."""
    text = address.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:")
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not is_number(port) or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port")
    return host, int(port)
