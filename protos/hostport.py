"""host:port, as the configuration gives airctld's address (which airctld binds and the tools call)
and its metrics address (which airctld binds for Prometheus)."""
from __future__ import annotations

from air.protos.limits import is_number


def split(address: str, bare_ipv6: bool = False) -> tuple[str, int]:
    """host and port of `host:port` or `[v6]:port`, and with `bare_ipv6` of `v6:port` too (a metrics
    address, which was read so; gRPC binds only the bracketed form); ValueError for anything else,
    such as gRPC's target prefixes (`dns:///`, `ipv4:`), which airctld could not bind. A port is a
    number from 1 to 65535."""
    host, sep, port = address.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not sep or not host or "/" in host or not is_number(port) or not 0 < int(port) < 65536 or \
            (":" in host and not bracketed and not (bare_ipv6 and _ipv6(host))):
        raise ValueError(f"{address!r} is not host:port")
    return host, int(port)


def _ipv6(host: str) -> bool:
    import ipaddress
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False
