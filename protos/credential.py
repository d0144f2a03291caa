"""How a caller's identity crosses the wire: one interface, two implementations.

- "munge": every call carries a fresh MUNGE credential in its metadata (`air-cred`); the
  receiver decodes it through its own munged and takes uid and gid from it, and only from it.
  munged refuses credentials that are forged (another key), expired, or replayed.
- "none": the client states its own uid and gid (`air-uid`/`air-gid`). Daemons accept this
  mode only when they listen on loopback addresses.

Clients call `auth.metadata()` for each call; servers call `auth.identify(context)`. No code
trusts a user *name* sent by a client.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

UID_KEY = "air-uid"
GID_KEY = "air-gid"
CRED_KEY = "air-cred"
MODES = ("none", "munge")


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int

    @property
    def is_root(self) -> bool:
        return self.uid == 0


class StatedIds:
    """auth = "none": the caller's word, for a cluster on one machine."""

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((UID_KEY, str(os.getuid())), (GID_KEY, str(os.getgid())))

    def identify(self, context: grpc.ServicerContext) -> Identity:
        md = dict(context.invocation_metadata())
        try:
            return Identity(int(md[UID_KEY]), int(md[GID_KEY]))
        except (KeyError, ValueError):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the request carries no credential")
            raise


class MungeCredentials:
    """auth = "munge": credentials from and checked by munged (see protos/munge.py)."""

    def __init__(self, socket: str = ""):
        from protos.munge import Munge
        self.munge = Munge(socket)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        from protos.munge import MungeError
        try:
            return ((CRED_KEY, self.munge.encode()),)
        except MungeError as e:
            raise CredentialError(f"cannot get a MUNGE credential: {e}") from None

    def identify(self, context: grpc.ServicerContext) -> Identity:
        from protos import munge
        cred = dict(context.invocation_metadata()).get(CRED_KEY)
        if not cred:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the request carries no MUNGE credential")
        try:
            uid, gid, _ = self.munge.decode(cred)
        except munge.MungeError as e:
            why = {munge.EMUNGE_CRED_REPLAYED: "the MUNGE credential was replayed",
                   munge.EMUNGE_CRED_EXPIRED: "the MUNGE credential has expired",
                   munge.EMUNGE_CRED_REWOUND: "the MUNGE credential comes from the future (clock skew)",
                   munge.EMUNGE_CRED_INVALID: "the MUNGE credential is invalid (a different MUNGE key?)",
                   munge.EMUNGE_SOCKET: "this daemon cannot reach munged"}.get(e.code)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{why or 'the MUNGE credential was refused'}: {e}")
            raise
        return Identity(uid, gid)


class CredentialError(Exception):
    pass


def from_settings(mode: str, munge_socket: str = ""):
    """The authenticator for [controller] auth and munge_socket."""
    if mode == "munge":
        return MungeCredentials(munge_socket)
    return StatedIds()
