"""The tools' unary calls to airctld: gRPC's wire format over HTTP/2, spoken by this module.

A short command (airbatch, airq, aircancel) spent about a third of its time importing grpcio
(`python -X importtime`: 35 to 50 ms of its C core and asyncio), and then a third of what was left
importing the h2 library (with hpack, logging and its event classes). A unary call needs little of
HTTP/2 (RFC 9113) and gRPC (PROTOCOL-HTTP2.md in grpc's repository): one POST per call on a
connection kept per thread, the message framed as a compressed flag and a 4-byte length, the status
in the trailers (or in a trailers-only response); on the connection, settings and their acks, pings,
flow control both ways, GOAWAY and stream resets. Header blocks are aircli.hpack's. airrun's streams
and the daemons keep grpcio. Pure of the tools' vocabulary: bytes in, bytes out, a `WireError` with
gRPC's status name for any failure.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

from air.aircli import hpack

# gRPC's status codes, by number (grpc/doc/statuscodes.md)
STATUS = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
          "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
          "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
WINDOW = 1 << 30          # what the server may send before we say we took it
READ_BYTES = 1 << 22
MAX_FRAME = 1 << 20       # frames of up to 1 MiB: fewer to handle in Python than 16 KiB ones
MAX_HEADER_BLOCK = 1 << 16   # a header block's bytes, over its HEADERS and CONTINUATION frames (and its
#                              decoded size: hpack.MAX_HEADER_LIST, told to the server in the settings)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
ENABLE_PUSH, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 2, 4, 5, 6
DEFAULT_WINDOW, DEFAULT_FRAME = 65535, 16384
REFUSED_STREAM = 7


class WireError(Exception):
    def __init__(self, code: str, details: str, unprocessed: bool = False, maybe_done: bool = False):
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
        self.unprocessed = unprocessed   # the server said it did not take the call (GOAWAY before it)
        self.maybe_done = maybe_done     # the connection went after the server had the whole call


class Channel:
    """Unary calls to one `host:port`, on an HTTP/2 connection of each thread's own, opened at its
    first call and opened again when the server has closed it. A call that fails after its request
    was sent is never sent again (a submission could be taken twice), but for one the server's GOAWAY
    says it never took: that one is, once, on a new connection."""

    def __init__(self, address: str, max_send_bytes: int):
        self.address = address
        self.max_send_bytes = max_send_bytes
        self._host, self._port = _split(address)
        self._authority = f"[{self._host}]:{self._port}" if ":" in self._host else f"{self._host}:{self._port}"
        self._local = threading.local()

    def call(self, method: str, request: bytes, metadata: tuple[tuple[str, str], ...], timeout: float) -> memoryview:
        """The reply's bytes for `request` sent to `method` ("/package.Service/Method")."""
        if len(request) > self.max_send_bytes:
            raise WireError("RESOURCE_EXHAUSTED", f"the request is {len(request)} bytes, larger than "
                                                  f"max_message_bytes ({self.max_send_bytes})")
        deadline = time.monotonic() + timeout
        for attempt in (1, 2):
            if time.monotonic() >= deadline:   # (never sent once the caller has been told it timed out)
                raise WireError("DEADLINE_EXCEEDED", "deadline exceeded")
            link = getattr(self._local, "link", None)
            if link is None or not link.usable(deadline):   # (closed by the server since the last call: a new one)
                if link is not None:
                    link.close()
                link = self._local.link = _Link(self._host, self._port, deadline)
            try:
                return link.call(self._authority, method, request, metadata, deadline)
            except WireError as e:
                self._drop(link)
                if not (e.unprocessed and attempt == 1):   # only a call the server never took is sent again
                    raise
            except BaseException:
                self._drop(link)
                raise
        raise AssertionError("unreachable")

    def _drop(self, link: _Link) -> None:
        self._local.link = None   # (whatever the connection's state now, the next call starts afresh)
        link.close()

    def close(self) -> None:
        link = getattr(self._local, "link", None)
        if link is not None:
            self._drop(link)


class ProtocolError(Exception):
    """The server broke HTTP/2 or HPACK: the call fails with one line, and the connection is dropped."""


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


class _Link:
    """One HTTP/2 connection, and the call on it (one at a time: a thread's)."""

    def __init__(self, host: str, port: int, deadline: float):
        try:
            self.sock = _connect(host, port, max(0.001, deadline - time.monotonic()))
        except socket.timeout:
            raise WireError("UNAVAILABLE", f"failed to connect to {host}:{port}: timed out") from None
        except OSError as e:
            raise WireError("UNAVAILABLE", f"failed to connect to {host}:{port}: "
                                           f"{e.strerror or type(e).__name__}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.closed = False
        self.decoder = hpack.Decoder()
        self.inbox = bytearray()     # what has arrived and is not yet a whole frame
        self.block: list | None = None   # a header block that waits for its CONTINUATION frames: [stream, flags, bytes]
        self.goaway: int | None = None   # the last stream the server said it takes, once it has sent a GOAWAY
        self.next_stream = 1
        self.send_window = DEFAULT_WINDOW           # the connection's, for what this side sends
        self.peer_initial_window = DEFAULT_WINDOW   # each new stream's (the server's SETTINGS)
        self.peer_max_frame = DEFAULT_FRAME
        self.taken = 0       # bytes of DATA taken on the connection since the last WINDOW_UPDATE
        self.reply: _Reply | None = None
        self.deadline = deadline   # what is read is acted on only until then (a server's frames cost CPU)
        self.sent = False          # the whole call has left: a failure now may be after the server took it
        # The preface and this side's settings; frames of MAX_FRAME are taken from now on (taking larger
        # frames before the server's ack asks nothing of it; a server that answers at once may send the
        # ack and frames of the new size in one write)
        settings = b"".join(struct.pack(">HI", key, value) for key, value in
                            ((ENABLE_PUSH, 0), (INITIAL_WINDOW_SIZE, WINDOW), (MAX_FRAME_SIZE, MAX_FRAME),
                             (MAX_HEADER_LIST_SIZE, hpack.MAX_HEADER_LIST)))
        self.out = bytearray(PREFACE + _frame(SETTINGS, 0, 0, settings)
                             + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WINDOW - DEFAULT_WINDOW)))

    def usable(self, deadline: float) -> bool:
        """Whether the connection is still open, after taking in what arrived since the last call (a
        GOAWAY of a server that stopped or restarted, a PING)."""
        if self.closed:
            return False
        self.deadline = deadline
        try:
            self.sock.setblocking(False)
            try:
                data = self.sock.recv(READ_BYTES)
            except BlockingIOError:
                data = None
            if data == b"":
                return False
            if data or self.inbox:   # (and what followed the last call's answer in its read)
                self._receive(data or b"")
            if self.out:
                self.sock.sendall(self.out)
                self.out.clear()
        except (OSError, ProtocolError, WireError):
            return False
        return self.goaway is None and self.next_stream < 1 << 31

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def call(self, authority: str, method: str, request: bytes, metadata, deadline: float) -> memoryview:
        self.deadline, self.sent = deadline, False
        try:
            return self._call(authority, method, request, metadata, deadline)
        except ProtocolError as e:   # (a server that breaks HTTP/2: one line, not a trace)
            raise WireError("INTERNAL", f"HTTP/2 error: {e}", maybe_done=self.sent) from None
        except WireError as e:   # (no answer in time to a call the server had whole: it may be carried out)
            if e.code == "DEADLINE_EXCEEDED" and self.sent:
                e.maybe_done = True
            raise
        finally:
            self.reply = None

    def _call(self, authority: str, method: str, request: bytes, metadata, deadline: float) -> memoryview:
        stream = self.next_stream
        self.next_stream += 2
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise WireError("DEADLINE_EXCEEDED", "deadline exceeded")
        self._send_headers(stream, hpack.encode([
            (":method", "POST"), (":scheme", "http"), (":path", method), (":authority", authority),
            ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-accept-encoding", "identity"),
            ("grpc-timeout", f"{min(left_ms, 99_999_999)}m"), ("user-agent", "air-cli"), *metadata]))
        body = memoryview(b"\0" + struct.pack(">I", len(request)) + request)
        reply = self.reply = _Reply(stream, self.peer_initial_window)
        while body or not reply.ended:
            while body:   # as much as the flow control windows let through; the rest once they open
                room = min(self.send_window, reply.send_window, self.peer_max_frame, len(body))
                if room <= 0:
                    break
                self.out += _frame(DATA, END_STREAM if room == len(body) else 0, stream, body[:room].tobytes())
                self.send_window -= room
                reply.send_window -= room
                body = body[room:]
            try:
                self._flush(deadline)
            except WireError as e:
                if reply.ended and reply.failure is None:
                    break   # (the answer is in: what this side still owed the server, acks, no longer matters)
                e.maybe_done = self.sent and e.code == "UNAVAILABLE"   # (the whole call had left before)
                raise
            self.sent = not body
            if reply.ended:
                break
            try:
                data = self._read(deadline)
            except WireError as e:
                e.maybe_done = self.sent and e.code == "UNAVAILABLE"
                raise
            self._receive(data)
            if reply.failure is not None and body:   # (the server never had the whole call)
                reply.failure.maybe_done = False
            if reply.ended and body:   # answered before it had the whole request: a trailers-only error
                break
        try:
            self._flush(deadline)
        except WireError:
            pass   # (acks of what was read: the next call finds out whether the connection is still good)
        return reply.result()

    def _send_headers(self, stream: int, block: bytes) -> None:
        first, rest = block[:self.peer_max_frame], block[self.peer_max_frame:]
        self.out += _frame(HEADERS, 0 if rest else END_HEADERS, stream, first)
        while rest:
            part, rest = rest[:self.peer_max_frame], rest[self.peer_max_frame:]
            self.out += _frame(CONTINUATION, 0 if rest else END_HEADERS, stream, part)

    def _receive(self, data: bytes) -> None:
        """Take in bytes from the server: each whole frame is acted on, the rest kept for the next read.
        Frames are read in place (a large DATA payload stays a view of the bytes read, copied once, when
        the reply is joined): an airq of 8 MB spent more on copying them than on all the rest."""
        inbox = self.inbox
        if len(inbox) >= 9 and len(inbox) >= 9 + _length(inbox):   # (frames left after an answer: at once)
            data = bytes(inbox) + data
            inbox.clear()
        view = memoryview(data)
        if inbox:   # a frame begun in an earlier read: made whole from this one's
            if len(inbox) < 9:
                take = 9 - len(inbox)
                inbox += view[:take]
                view = view[take:]
                if len(inbox) < 9:
                    return
            total = 9 + _length(inbox)
            take = total - len(inbox)
            inbox += view[:take]
            view = view[take:]
            if len(inbox) < total:
                return
            frame = memoryview(bytes(inbox))   # (its own bytes: what the reply keeps must not change)
            inbox.clear()
            self._frame_in(frame)
        pos, end = 0, len(view)
        while end - pos >= 9 and not self._answered():   # (what follows an answer waits for the next call's look)
            total = 9 + _length(view[pos:pos + 3])
            if end - pos < total:
                break
            if time.monotonic() >= self.deadline:   # (a read of 5 MB of frames is no way past the deadline)
                raise WireError("DEADLINE_EXCEEDED", "deadline exceeded")
            self._frame_in(view[pos:pos + total])
            pos += total
        inbox += view[pos:]

    def _answered(self) -> bool:
        return self.reply is not None and self.reply.ended and self.reply.failure is None

    def _frame_in(self, frame: memoryview) -> None:
        kind, flags = frame[3], frame[4]
        stream = int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF
        payload = frame[9:]
        if self.block is not None and kind != CONTINUATION:
            raise ProtocolError("a frame inside a header block")
        reply = self.reply if self.reply is not None and stream == self.reply.stream else None
        if stream and (stream % 2 == 0 or stream >= self.next_stream) and kind not in (PRIORITY, SETTINGS, PING,
                                                                                        GOAWAY):
            raise ProtocolError(f"a frame on stream {stream}, which this side never opened")
        if kind == DATA:
            if not stream:
                raise ProtocolError("DATA on stream 0")
            self.taken += len(payload)
            if self.taken >= WINDOW // 2:   # (the connection's window, opened again long before it closes)
                self.out += _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.taken))
                self.taken = 0
            if reply is not None:
                data = _unpadded(flags, payload)
                if 4 * len(data) < len(frame.obj):   # (a small part of a large read: kept on its own, not the read)
                    data = bytes(data)
                reply.data(data, len(payload), flags & END_STREAM)
        elif kind in (HEADERS, CONTINUATION):
            if kind == CONTINUATION:
                if self.block is None or self.block[0] != stream:
                    raise ProtocolError("a CONTINUATION frame outside a header block")
                self.block[2] += payload
            else:
                if not stream:
                    raise ProtocolError("HEADERS on stream 0")
                fragment = _unpadded(flags, payload)
                if flags & PRIORITY_FLAG:
                    if len(fragment) < 5:
                        raise ProtocolError("a HEADERS frame too short for its priority")
                    fragment = fragment[5:]
                self.block = [stream, flags, bytearray(fragment)]
            if len(self.block[2]) > MAX_HEADER_BLOCK:
                raise ProtocolError(f"a header block of more than {MAX_HEADER_BLOCK} bytes")
            if flags & END_HEADERS:
                stream, first_flags, block = self.block
                self.block = None
                try:   # (every block, for any stream: the decoder's table follows them all)
                    headers = self.decoder.decode(bytes(block))
                except hpack.HpackError as e:
                    raise ProtocolError(str(e)) from None
                if reply is not None:
                    reply.headers(headers, first_flags & END_STREAM)
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise ProtocolError("a RST_STREAM frame that is not 4 bytes")
            if reply is not None:
                reply.reset(int.from_bytes(payload, "big"))
        elif kind == SETTINGS:
            if flags & ACK:
                return
            if stream or len(payload) % 6:
                raise ProtocolError("a SETTINGS frame that is not one")
            for key, value in struct.iter_unpack(">HI", payload):
                if key == INITIAL_WINDOW_SIZE:
                    if value > 0x7FFFFFFF:
                        raise ProtocolError(f"an initial window of {value}")
                    if self.reply is not None:   # (RFC 9113 6.9.2: open streams' windows move by the change)
                        self.reply.send_window += value - self.peer_initial_window
                    self.peer_initial_window = value
                elif key == MAX_FRAME_SIZE:
                    if not DEFAULT_FRAME <= value < 1 << 24:
                        raise ProtocolError(f"a largest frame of {value}")
                    self.peer_max_frame = value
            self.out += _frame(SETTINGS, ACK, 0)
        elif kind == PING:
            if len(payload) != 8 or stream:
                raise ProtocolError("a PING frame that is not one")
            if not flags & ACK:
                self.out += _frame(PING, ACK, 0, payload)
        elif kind == GOAWAY:
            if len(payload) < 8:
                raise ProtocolError("a GOAWAY frame shorter than 8 bytes")
            last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            self.goaway = last if self.goaway is None else min(self.goaway, last)
            if self.reply is not None:
                self.reply.goaway(last, int.from_bytes(payload[4:8], "big"))
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise ProtocolError("a WINDOW_UPDATE frame that is not 4 bytes")
            increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if not increment:
                raise ProtocolError("a WINDOW_UPDATE of 0")
            if not stream:
                self.send_window += increment
                if self.send_window > 0x7FFFFFFF:
                    raise ProtocolError("a connection window over 2^31 - 1")
            elif reply is not None:
                reply.send_window += increment
                if reply.send_window > 0x7FFFFFFF:
                    raise ProtocolError("a stream window over 2^31 - 1")
        elif kind == PUSH_PROMISE:
            raise ProtocolError("a PUSH_PROMISE, which this side turned off")
        # (PRIORITY, and frame types this side does not know, are ignored: RFC 9113 4.1 and 5.3.2)

    def _flush(self, deadline: float) -> None:
        if self.out and not self.closed:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                self.sock.sendall(self.out)
            except socket.timeout:   # (some of it may have left: the connection's framing is lost)
                self.closed = True
                raise WireError("DEADLINE_EXCEEDED", "deadline exceeded while sending") from None
            except OSError as e:
                self.closed = True
                raise WireError("UNAVAILABLE", f"connection lost: {e.strerror or type(e).__name__}") from None
            self.out.clear()

    def _read(self, deadline: float) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WireError("DEADLINE_EXCEEDED", "deadline exceeded")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(READ_BYTES)
        except socket.timeout:
            raise WireError("DEADLINE_EXCEEDED", "deadline exceeded") from None
        except OSError as e:
            raise WireError("UNAVAILABLE", f"connection lost: {e.strerror or type(e).__name__}") from None
        if not data:
            raise WireError("UNAVAILABLE", "the server closed the connection")
        return data


def _length(header) -> int:
    length = int.from_bytes(header[:3], "big")
    if length > MAX_FRAME:
        raise ProtocolError(f"a frame of {length} bytes, over the {MAX_FRAME} allowed")
    return length


def _unpadded(flags: int, payload: memoryview) -> memoryview:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolError("padding longer than its frame")
    return payload[1:len(payload) - payload[0]]


class _Reply:
    """One call's reply as its frames arrive: the message's bytes and the status."""

    def __init__(self, stream: int, send_window: int):
        self.stream = stream
        self.send_window = send_window   # the stream's, for what this side sends
        self.chunks: list[bytes] = []
        self.received = 0
        self.status: dict[str, str] = {}
        self.http_status = ""
        self.responded = False
        self.ended = False
        self.failure: WireError | None = None

    def headers(self, headers: list[tuple[bytes, bytes]], end_stream: int) -> None:
        """The response's headers (after any informational ones), then the trailers, which end it; or a
        trailers-only response. Nothing more: each block is bounded, and so is their number."""
        if self.ended:
            return
        decoded = _decoded(headers)
        if not self.responded:
            self.http_status = decoded.get(":status", "")
            if self.http_status.startswith("1") and not end_stream:
                return   # (an informational response, kept nowhere: the real one follows)
            self.responded = True
        elif not end_stream:
            raise ProtocolError("a second header block that does not end the stream")
        self.status.update(decoded)
        if end_stream:
            self.ended = True

    def data(self, data: bytes, counted: int, end_stream: int) -> None:
        if self.ended:
            return
        if not self.responded:
            raise ProtocolError("DATA before the response's headers")
        self.received += counted
        if self.received > WINDOW:
            raise ProtocolError("more DATA than the stream's window")
        self.chunks.append(data)
        if end_stream:
            self.ended = True

    def reset(self, code: int) -> None:
        if self.ended and ("grpc-status" in self.status or self.failure is not None):
            return   # (after a complete answer, often a trailers-only error to a request not all read)
        self.ended = True
        if code == REFUSED_STREAM and not self.responded and not self.chunks:
            # RFC 9113 8.7: refused before any of it was processed, so sent again (not once it answered)
            self.failure = WireError("UNAVAILABLE", "the server refused the call (REFUSED_STREAM)", unprocessed=True)
        else:   # (maybe done: the link clears it where the whole call had not left)
            self.failure = WireError("INTERNAL", f"the server reset the call (error {code})", maybe_done=True)

    def goaway(self, last: int, code: int) -> None:
        taken = last >= self.stream
        if self.ended or (taken and code == 0):
            return   # (a call the server took goes on to its reply; the next call opens a new connection)
        self.ended = True
        unprocessed = not taken and not self.responded and not self.chunks   # (not once it began to answer)
        self.failure = WireError("UNAVAILABLE", f"the server closed the connection (GOAWAY, error {code})",
                                 unprocessed=unprocessed, maybe_done=not unprocessed)

    def result(self) -> memoryview:
        if self.failure is not None:
            raise self.failure
        code = self.status.get("grpc-status")
        if code is None:
            raise WireError("UNKNOWN" if self.http_status == "200" else "UNAVAILABLE",
                            f"no gRPC status in the reply (HTTP {self.http_status or 'none'})")
        number = int(code) if code.isascii() and code.isdigit() else 2
        if number != 0:
            name = STATUS[number] if number < len(STATUS) else "UNKNOWN"
            import urllib.parse   # (a failure's message only: not a cost of every command's start)
            raise WireError(name, urllib.parse.unquote(self.status.get("grpc-message", "")))
        data = memoryview(b"".join(self.chunks))   # (one copy of a reply of MBs, and no other)
        if len(data) < 5 or data[0] != 0:
            raise WireError("INTERNAL", "the reply is not one uncompressed message")
        size = struct.unpack(">I", data[1:5])[0]
        if size != len(data) - 5:
            raise WireError("INTERNAL", f"the reply's message says {size} bytes and has {len(data) - 5}")
        return data[5:]


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection; to an address as such without a name lookup (getaddrinfo of a str imports
    Python's IDNA codec first: 10 ms of a 100 ms command)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection((host, port), timeout=timeout)


def _decoded(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("utf-8", "replace") for k, v in headers}


def _split(address: str) -> tuple[str, int]:
    """host and port of `host:port` or `[v6]:port`."""
    from air.protos import hostport
    try:
        return hostport.split(address)
    except ValueError as e:
        raise WireError("UNAVAILABLE", str(e)) from None
