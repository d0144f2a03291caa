"""MUNGE credentials through libmunge (ctypes): encode for outgoing calls, decode for incoming ones.

libmunge rather than the munge/unmunge programs: one call is a round trip to munged over its
Unix socket (tens of microseconds), where a program costs a fork and exec (milliseconds) per RPC.
"""
from __future__ import annotations

import ctypes
import threading

SONAME = "libmunge.so.2"
MUNGE_OPT_TTL = 4
MUNGE_OPT_SOCKET = 8

# munge_err_t values that name what was wrong with a credential
EMUNGE_SOCKET = 6
EMUNGE_CRED_INVALID = 14
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17


class MungeError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


_lib = None
_lib_lock = threading.Lock()


def _load():
    global _lib
    with _lib_lock:
        if _lib is None:
            lib = _open_library()
            lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_int]
            lib.munge_encode.restype = ctypes.c_int
            lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint),
                                         ctypes.POINTER(ctypes.c_uint)]
            lib.munge_decode.restype = ctypes.c_int
            lib.munge_strerror.argtypes = [ctypes.c_int]
            lib.munge_strerror.restype = ctypes.c_char_p
            lib.munge_ctx_create.restype = ctypes.c_void_p
            lib.munge_ctx_set.restype = ctypes.c_int
            lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
            lib.munge_ctx_destroy.restype = None
            lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
            lib.munge_ctx_strerror.restype = ctypes.c_char_p
            libc = ctypes.CDLL(None)
            libc.free.argtypes = [ctypes.c_void_p]
            lib._free = libc.free
            _lib = lib
        return _lib


def _open_library() -> ctypes.CDLL:
    """libmunge by its soname, as the dynamic loader finds it; else where ctypes.util looks (ldconfig's
    cache, gcc, ld). That lookup, and the import of ctypes.util with subprocess and shutil, cost a
    tool's start 30 to 40 ms, so they come second."""
    try:
        return ctypes.CDLL(SONAME)
    except OSError:
        pass
    from ctypes.util import find_library
    path = find_library("munge")
    try:
        if path is None:
            raise OSError
        return ctypes.CDLL(path)
    except OSError:
        raise MungeError(0, "libmunge is not installed (Debian: apt-get install munge)") from None


class Munge:
    """libmunge bound to one munged socket. Each call gets a context of its own: decoding writes
    the credential's settings into the context, so a shared one would carry them between calls
    and threads."""

    def __init__(self, socket: str = "", ttl: int = 0):
        self.lib = _load()
        self.socket = socket
        self.ttl = ttl

    def _ctx(self) -> ctypes.c_void_p:
        ctx = ctypes.c_void_p(self.lib.munge_ctx_create())
        if self.socket:
            self.lib.munge_ctx_set(ctx, MUNGE_OPT_SOCKET, self.socket.encode())
        if self.ttl:
            self.lib.munge_ctx_set(ctx, MUNGE_OPT_TTL, ctypes.c_int(self.ttl))
        return ctx

    def _error(self, ctx, code: int) -> MungeError:
        text = self.lib.munge_ctx_strerror(ctx) or self.lib.munge_strerror(code)
        return MungeError(code, text.decode(errors="replace"))

    def encode(self, payload: bytes = b"") -> str:
        ctx = self._ctx()
        cred = ctypes.c_char_p()
        try:
            buf = ctypes.create_string_buffer(payload, len(payload)) if payload else None
            code = self.lib.munge_encode(ctypes.byref(cred), ctx, buf, len(payload))
            if code:
                raise self._error(ctx, code)
            return cred.value.decode()
        finally:
            if cred.value is not None:
                self.lib._free(cred)
            self.lib.munge_ctx_destroy(ctx)

    def decode(self, cred: str) -> tuple[int, int, bytes]:
        """(uid, gid, payload) of a credential, or MungeError saying why it is not good."""
        ctx = self._ctx()
        buf, length = ctypes.c_void_p(), ctypes.c_int()
        uid, gid = ctypes.c_uint(), ctypes.c_uint()
        try:
            code = self.lib.munge_decode(cred.encode(), ctx, ctypes.byref(buf), ctypes.byref(length),
                                         ctypes.byref(uid), ctypes.byref(gid))
            if code:
                raise self._error(ctx, code)
            return uid.value, gid.value, ctypes.string_at(buf, length.value) if buf.value else b""
        finally:
            if buf.value:
                self.lib._free(buf)
            self.lib.munge_ctx_destroy(ctx)
