"""host:port as the configuration gives airctld's address, and the tools and daemons use it."""
from __future__ import annotations

from air.protos.limits import is_number


def split(address: str, prefixed: bool = True) -> tuple[str, int]:
    """host and port of `host:port` or `[v6]:port`, and with `prefixed` (a gRPC target) of
    `dns:///host:port`, `ipv4:host:port` or `ipv6:[v6]:port`; ValueError for anything else (a port
    is a number from 1 to 65535)."""
    text = address.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:") if prefixed else address
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")   # (an IPv6 address; any other ":" is not a host's)
    host = host[1:-1] if bracketed else host
    if not sep or not host or (":" in host and not bracketed) or "/" in host or not is_number(port) or \
            not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port")
    return host, int(port)
