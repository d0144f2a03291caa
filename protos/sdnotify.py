"""systemd's readiness protocol: one datagram to $NOTIFY_SOCKET. A no-op outside systemd."""
from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send e.g. "READY=1" or "STOPPING=1"; True if a service manager was told."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):          # abstract namespace
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(state.encode(), path)
        except OSError:
            return False
    return True
