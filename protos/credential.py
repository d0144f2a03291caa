"""How a caller's identity crosses the wire.

For now the only mode is "none": the client states its own uid and gid in call metadata,
and the server accepts them only because it listens on loopback alone (the controller
refuses to start otherwise). This module is the one seam that MUNGE credentials replace:
clients call `metadata()`, servers call `identify()`; no code trusts a user *name* sent
by a client.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

UID_KEY = "air-uid"
GID_KEY = "air-gid"


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def metadata() -> tuple[tuple[str, str], ...]:
    """Credential for an outgoing call, from the calling process's own ids."""
    return ((UID_KEY, str(os.getuid())), (GID_KEY, str(os.getgid())))


def identify(context: grpc.ServicerContext) -> Identity:
    """The caller's identity, or abort the call with UNAUTHENTICATED."""
    md = dict(context.invocation_metadata())
    try:
        return Identity(int(md[UID_KEY]), int(md[GID_KEY]))
    except (KeyError, ValueError):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "the request carries no credential (air-uid/air-gid)")
        raise  # abort raises; this line keeps type checkers honest
