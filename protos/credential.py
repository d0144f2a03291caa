"""How a caller's identity crosses the wire: one interface, two implementations.

- "munge": every call carries a fresh MUNGE credential in its metadata (`air-cred`); the
  receiver decodes it through its own munged and takes uid and gid from it, and only from it.
  munged refuses credentials that are forged (another key), expired, or replayed. The
  credential's payload binds it to one call: the method, the receiver it was made for (the
  controller's address, or a node's name) and a SHA-256 of the request's bytes. The receiver
  rebuilds that payload from what it received and refuses any difference, so a credential
  captured off the wire cannot be replayed on another request, method or node (munged's own
  replay cache is per host: without the binding one credential would pass once on every host).
- "none": the client states its own uid and gid (`air-uid`/`air-gid`). Daemons accept this
  mode only when they listen on loopback addresses.

Clients wrap their channels with `signed(channel, auth, target)`, which adds the credential to
every call; servers call `auth.identify(context, method, request, target)`. No code trusts a
user *name* sent by a client.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from air.protos.record import Record

if TYPE_CHECKING:   # (grpc is imported where a channel is signed or a call identified: the tools' calls
    import grpc     # go without it, see aircli/wire.py)

UID_KEY = "air-uid"
GID_KEY = "air-gid"
CRED_KEY = "air-cred"
MODES = ("none", "munge")


class Identity(Record):
    uid: int
    gid: int

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def binding(method: str, target: str, request: bytes) -> bytes:
    """What a credential's payload says it was made for."""
    import hashlib   # (here: OpenSSL's start is a few ms that a call without a credential need not pay)
    return f"air1\n{method}\n{target}\n{hashlib.sha256(request).hexdigest()}".encode()


def request_bytes(request) -> bytes:
    """A message's bytes as both ends compute them (deterministic: maps in key order)."""
    return request.SerializeToString(deterministic=True)


class StatedIds:
    """auth = "none": the caller's word, for a cluster on one machine."""

    def metadata(self, method: str = "", target: str = "", request: bytes = b"") -> tuple[tuple[str, str], ...]:
        return ((UID_KEY, str(os.getuid())), (GID_KEY, str(os.getgid())))

    def identify(self, context: grpc.ServicerContext, method: str = "", request=None, target: str = "",
                 data: bytes | None = None) -> Identity:
        import grpc
        md = dict(context.invocation_metadata())
        try:
            return Identity(int(md[UID_KEY]), int(md[GID_KEY]))
        except (KeyError, ValueError):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the request carries no credential")
            raise


class MungeCredentials:
    """auth = "munge": credentials from and checked by munged (see protos/munge.py)."""

    def __init__(self, socket: str = ""):
        from air.protos.munge import Munge
        self.munge = Munge(socket)

    def metadata(self, method: str, target: str, request: bytes) -> tuple[tuple[str, str], ...]:
        from air.protos.munge import MungeError
        try:
            return ((CRED_KEY, self.munge.encode(binding(method, target, request))),)
        except MungeError as e:
            raise CredentialError(f"cannot get a MUNGE credential: {e}") from None

    def identify(self, context: grpc.ServicerContext, method: str, request, target: str,
                 data: bytes | None = None) -> Identity:
        """The caller's identity from its credential, which must be bound to this method, this receiver
        and this request: to the bytes it came in (`data`, where the server kept them), or to the
        request's deterministic serialization here. The bytes are what a caller that writes its own
        (protos.protowire) signs; a serialization can differ between protobuf's versions and
        backends (the order of a map's keys), the bytes received cannot."""
        import grpc
        from air.protos import munge
        cred = dict(context.invocation_metadata()).get(CRED_KEY)
        if not cred:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the request carries no MUNGE credential")
        try:
            uid, gid, payload = self.munge.decode(cred)
        except munge.MungeError as e:
            why = {munge.EMUNGE_CRED_REPLAYED: "the MUNGE credential was replayed",
                   munge.EMUNGE_CRED_EXPIRED: "the MUNGE credential has expired",
                   munge.EMUNGE_CRED_REWOUND: "the MUNGE credential comes from the future (clock skew)",
                   munge.EMUNGE_CRED_INVALID: "the MUNGE credential is invalid (a different MUNGE key?)",
                   munge.EMUNGE_SOCKET: "this daemon cannot reach munged"}.get(e.code)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{why or 'the MUNGE credential was refused'}: {e}")
            raise
        if data is not None and payload == binding(method, target, data):
            return Identity(uid, gid)
        mismatch = _mismatch(payload, binding(method, target, request_bytes(request)))
        if mismatch:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"the MUNGE credential was made for {mismatch}")
        return Identity(uid, gid)


def _mismatch(got: bytes, expected: bytes) -> str:
    """'' when the payload is the one expected, else what it was made for instead."""
    if got == expected:
        return ""
    parts = got.decode(errors="replace").split("\n")
    want = expected.decode().split("\n")
    if len(parts) != 4 or parts[0] != want[0]:
        return "no request in particular (no binding in its payload); it is good for no call"
    if parts[1] != want[1]:
        return f"another method ({parts[1][:80]}), not {want[1]}"
    if parts[2] != want[2]:
        return f"another receiver ({parts[2][:80]}), not {want[2]}"
    return "another request (its hash differs from this request's)"


def signed(channel: grpc.Channel, auth, target: str) -> grpc.Channel:
    """A channel whose every call carries `auth`'s credential, bound to the call and to `target`."""
    import grpc
    return grpc.intercept_channel(channel, _signer_class()(auth, target))


_SIGNER = None


def _signer_class():
    """The interceptor's class, made at first use (its bases are grpc's)."""
    global _SIGNER
    if _SIGNER is not None:
        return _SIGNER
    import collections
    import grpc

    class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                                "wait_for_ready", "compression")),
                       grpc.ClientCallDetails):
        pass

    class _Signer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
        """Adds a credential bound to each call's method, receiver and request."""

        def __init__(self, auth, target: str):
            self.auth = auth
            self.target = target

        def _details(self, details, request):
            method = details.method.decode() if isinstance(details.method, bytes) else details.method
            metadata = list(details.metadata or ()) + list(self.auth.metadata(method, self.target,
                                                                              request_bytes(request)))
            return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                                details.wait_for_ready, details.compression)

        def intercept_unary_unary(self, continuation, details, request):
            return continuation(self._details(details, request), request)

        def intercept_unary_stream(self, continuation, details, request):
            return continuation(self._details(details, request), request)

    _SIGNER = _Signer
    return _SIGNER


class CredentialError(Exception):
    pass


def from_settings(mode: str, munge_socket: str = ""):
    """The authenticator for [controller] auth and munge_socket."""
    if mode == "munge":
        return MungeCredentials(munge_socket)
    return StatedIds()
