"""The tools' unary calls to airctld: gRPC's wire format over HTTP/2, spoken with the h2 library.

A short command (airbatch, airq, aircancel) spent about a third of its time importing grpcio
(`python -X importtime`: 35 to 50 ms of its C core and asyncio); h2 imports in a fraction of that.
This speaks the part of gRPC a unary call needs (PROTOCOL-HTTP2.md in grpc's repository): one POST
per call on a connection kept per thread, the message framed as a compressed flag and a 4-byte
length, and the status in the trailers (or in a trailers-only response). airrun's streams and the
daemons keep grpcio. Pure of the tools' vocabulary: bytes in, bytes out, a `WireError` with gRPC's
status name for any failure.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame

# gRPC's status codes, by number (grpc/doc/statuscodes.md)
STATUS = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
          "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
          "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
WINDOW = 1 << 30          # what the server may send before we say we took it (we take everything at once)
READ_BYTES = 1 << 22
MAX_FRAME = 1 << 20       # frames of up to 1 MiB: fewer to handle in Python than 16 KiB ones, and h2
#                           reassembles each by concatenation (larger ones cost more than they save)


# h2 builds repr(frame) of every frame it receives, for a trace log that is off: for a DATA frame
# that copies and hex-encodes the whole body (an 8 MB airq took 40 ms more). A DATA frame's repr
# says its size instead. (Only in processes that import this module: the tools.)
hyperframe.frame.DataFrame._body_repr = lambda self: f"<{len(self.data)} bytes>"


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
            if link is None or not link.usable():   # (closed by the server since the last call: a new one)
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


class _Connection(h2.connection.H2Connection):
    """h2's connection, except that a GOAWAY does not close it at once (h2 does, python-hyper/h2#1181):
    a server that stops gracefully sends one and finishes the calls it has taken (RFC 9113 6.8), so a
    call in flight then gets its reply. `goaway` keeps the last stream the server said it takes; no
    new call starts on the connection after one."""

    goaway: int | None = None

    def _receive_goaway_frame(self, frame):
        last = frame.last_stream_id
        self.goaway = last if self.goaway is None else min(self.goaway, last)
        event = h2.events.ConnectionTerminated()
        try:
            event.error_code = h2.errors.ErrorCodes(frame.error_code)
        except ValueError:
            event.error_code = frame.error_code
        event.last_stream_id = last
        event.additional_data = frame.additional_data or None
        return [], [event]


class _Link:
    """One HTTP/2 connection."""

    def __init__(self, host: str, port: int, deadline: float):
        try:
            self.sock = _connect(host, port, max(0.001, deadline - time.monotonic()))
        except socket.timeout:
            raise WireError("UNAVAILABLE", f"failed to connect to {host}:{port}: timed out") from None
        except OSError as e:
            raise WireError("UNAVAILABLE", f"failed to connect to {host}:{port}: "
                                           f"{e.strerror or type(e).__name__}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # (headers arrive as bytes: a value that is not UTF-8 is decoded with replacement, not raised on)
        self.conn = _Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
                                   h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME})
        # frames of that size are taken from now on: h2 applies the server's ack of the setting only to the
        # reads after the one that holds it, and a server that answers at once may send the ack and frames
        # of the new size in one write (taking larger frames early asks nothing of the server)
        self.conn.max_inbound_frame_size = MAX_FRAME
        self.conn.increment_flow_control_window(WINDOW - 65535)
        self.closed = False

    def usable(self) -> bool:
        """Whether the connection is still open, after taking in what arrived since the last call (a
        GOAWAY of a server that stopped or restarted, a PING)."""
        if self.closed:
            return False
        try:
            self.sock.setblocking(False)
            try:
                data = self.sock.recv(READ_BYTES)
            except BlockingIOError:
                data = None
            if data == b"":
                return False
            if data:
                self.conn.receive_data(data)
                out = self.conn.data_to_send()
                if out:
                    self.sock.sendall(out)
        except (OSError, ValueError, h2.exceptions.H2Error):
            return False
        return self.conn.goaway is None and self.conn.state_machine.state != h2.connection.ConnectionState.CLOSED

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def call(self, authority: str, method: str, request: bytes, metadata, deadline: float) -> memoryview:
        try:
            return self._call(authority, method, request, metadata, deadline)
        except (h2.exceptions.H2Error, ValueError) as e:   # (a server that breaks HTTP/2: one line, not a trace)
            raise WireError("INTERNAL", f"HTTP/2 error: {e or type(e).__name__}") from None

    def _call(self, authority: str, method: str, request: bytes, metadata, deadline: float) -> memoryview:
        conn = self.conn
        stream = conn.get_next_available_stream_id()
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise WireError("DEADLINE_EXCEEDED", "deadline exceeded")
        conn.send_headers(stream, [
            (":method", "POST"), (":scheme", "http"), (":path", method), (":authority", authority),
            ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-accept-encoding", "identity"),
            ("grpc-timeout", f"{min(left_ms, 99_999_999)}m"), ("user-agent", "air-cli"), *metadata])
        body = memoryview(b"\0" + struct.pack(">I", len(request)) + request)
        reply = _Reply()
        sent = False   # the whole call has left: a connection lost now may have been after the server took it
        while body or not reply.ended:
            while body:   # as much as the flow control windows let through; the rest once they open
                room = min(conn.local_flow_control_window(stream), conn.max_outbound_frame_size, len(body))
                if room <= 0:
                    break
                conn.send_data(stream, body[:room].tobytes(), end_stream=room == len(body))
                body = body[room:]
            try:
                self._flush(deadline)
            except WireError as e:
                if reply.ended and reply.failure is None:
                    break   # (the answer is in: what this side still owed the server, acks, no longer matters)
                e.maybe_done = sent and e.code == "UNAVAILABLE"   # (`sent`: the whole call had left before)
                raise
            sent = not body
            if reply.ended:
                break
            try:
                data = self._read(deadline)
            except WireError as e:
                e.maybe_done = sent and e.code == "UNAVAILABLE"
                raise
            for event in conn.receive_data(data):
                reply.take(event, stream, conn)
            if reply.failure is not None and body:   # (the server never had the whole call)
                reply.failure.maybe_done = False
            if reply.ended and body:   # answered before it had the whole request: a trailers-only error
                break
        try:
            self._flush(deadline)
        except WireError:
            pass   # (acks of what was read: the next call finds out whether the connection is still good)
        return reply.result()

    def _flush(self, deadline: float) -> None:
        out = self.conn.data_to_send()
        if out:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                self.sock.sendall(out)
            except socket.timeout:
                raise WireError("DEADLINE_EXCEEDED", "deadline exceeded while sending") from None
            except OSError as e:
                raise WireError("UNAVAILABLE", f"connection lost: {e.strerror or type(e).__name__}") from None

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


class _Reply:
    """One call's reply as its events arrive: the message's bytes and the status."""

    def __init__(self):
        self.chunks: list[bytes] = []
        self.status: dict[str, str] = {}
        self.http_status = ""
        self.ended = False
        self.failure: WireError | None = None

    def take(self, event, stream: int, conn: h2.connection.H2Connection) -> None:
        if isinstance(event, h2.events.ConnectionTerminated):
            taken = event.last_stream_id is not None and event.last_stream_id >= stream
            if self.ended or (taken and event.error_code == 0):
                return   # (a call the server took goes on to its reply; the next call opens a new connection)
            self.ended = True
            self.failure = WireError("UNAVAILABLE", f"the server closed the connection (GOAWAY, error "
                                                    f"{event.error_code})", unprocessed=not taken, maybe_done=taken)
            return
        if getattr(event, "stream_id", stream) != stream:
            return
        if isinstance(event, h2.events.ResponseReceived):
            headers = _decoded(event.headers)
            self.http_status = headers.get(":status", "")
            self.status.update(headers)   # (a trailers-only response has its status here)
        elif isinstance(event, h2.events.DataReceived):
            self.chunks.append(event.data)
            if event.flow_controlled_length:
                conn.acknowledge_received_data(event.flow_controlled_length, stream)
        elif isinstance(event, h2.events.TrailersReceived):
            self.status.update(_decoded(event.headers))
        elif isinstance(event, h2.events.StreamEnded):
            self.ended = True
        elif isinstance(event, h2.events.StreamReset):
            if self.ended and "grpc-status" in self.status:
                return   # (after a complete answer, often a trailers-only error to a request not all read)
            self.ended = True
            self.failure = WireError("UNAVAILABLE" if event.error_code == 7 else "INTERNAL",   # 7: REFUSED_STREAM
                                     f"the server reset the call (error {event.error_code})")

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


def _decoded(headers) -> dict[str, str]:
    return {(k.decode("latin-1") if isinstance(k, bytes) else k): (v.decode("utf-8", "replace") if isinstance(v, bytes)
                                                                   else v) for k, v in headers}


def _split(address: str) -> tuple[str, int]:
    """host and port of `host:port`, `[v6]:port` or `dns:///host:port`."""
    text = address.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise WireError("UNAVAILABLE", f"{address!r} is not host:port")
    return host.strip("[]"), int(port)
