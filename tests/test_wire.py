"""The tools' HTTP/2 calls (aircli/wire.py) against a real grpcio server: what arrives, both ways,
byte for byte; statuses and their messages; flow control both ways; deadlines; a server away."""
import threading
import time
from concurrent import futures

import grpc
import pytest

from air.aircli.wire import Channel, WireError
from cluster import free_port

SENT: list[tuple[bytes, dict]] = []


def _echo(request: bytes, context) -> bytes:
    SENT.append((request, dict(context.invocation_metadata())))
    if request.startswith(b"fail:"):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, request[5:].decode())
    if request.startswith(b"sleep:"):
        time.sleep(float(request[6:]))
    if request.startswith(b"big:"):
        return bytes(range(256)) * (int(request[4:]) // 256)
    return b"got " + request[:64] + b" of %d" % len(request)


def _server(port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(4), options=[("grpc.max_receive_message_length", 64 << 20),
                                                                 ("grpc.max_send_message_length", 64 << 20)])
    handler = grpc.unary_unary_rpc_method_handler(_echo, request_deserializer=None, response_serializer=None)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {"Echo": handler})])
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


@pytest.fixture()
def served():
    port = free_port()
    server = _server(port)
    yield port, server
    server.stop(0)


def test_a_call_carries_its_bytes_and_metadata_and_returns_the_reply(served):
    port, _ = served
    ch = Channel(f"127.0.0.1:{port}", 32 << 20)
    assert ch.call("/t.T/Echo", b"hello", (("air-uid", "7"), ("air-cred", "x" * 300)), 5) == b"got hello of 5"
    request, metadata = SENT[-1]
    assert request == b"hello" and metadata["air-uid"] == "7" and metadata["air-cred"] == "x" * 300
    assert ch.call("/t.T/Echo", b"", (), 5) == b"got  of 0"   # an empty message is a message
    # a request and a reply larger than every initial flow control window, each byte where it was
    payload = bytes(range(251)) * 20_000
    assert ch.call("/t.T/Echo", payload, (), 10) == b"got " + payload[:64] + b" of %d" % len(payload)
    assert SENT[-1][0] == payload
    assert ch.call("/t.T/Echo", b"big:%d" % (8 << 20), (), 10) == bytes(range(256)) * ((8 << 20) // 256)


def test_statuses_come_back_with_their_code_and_message(served):
    port, _ = served
    ch = Channel(f"127.0.0.1:{port}", 32 << 20)
    with pytest.raises(WireError) as e:
        ch.call("/t.T/Echo", "fail:job 5 is done; ü ünïcode 100%".encode(), (), 5)
    assert (e.value.code, e.value.details) == ("FAILED_PRECONDITION", "job 5 is done; ü ünïcode 100%")
    with pytest.raises(WireError) as e:
        ch.call("/t.T/Nothing", b"x", (), 5)
    assert e.value.code == "UNIMPLEMENTED"
    assert ch.call("/t.T/Echo", b"after", (), 5) == b"got after of 5"   # the channel goes on


def test_deadlines_a_refused_size_and_a_server_that_is_away_or_comes_back():
    port = free_port()
    ch = Channel(f"127.0.0.1:{port}", 1000)
    with pytest.raises(WireError) as e:
        ch.call("/t.T/Echo", b"x", (), 2)
    assert e.value.code == "UNAVAILABLE" and "failed to connect" in e.value.details
    with pytest.raises(WireError) as e:
        ch.call("/t.T/Echo", b"x" * 1001, (), 2)
    assert e.value.code == "RESOURCE_EXHAUSTED"
    server = _server(port)
    try:
        assert ch.call("/t.T/Echo", b"up", (), 5) == b"got up of 2"
        t = time.monotonic()
        with pytest.raises(WireError) as e:
            ch.call("/t.T/Echo", b"sleep:3", (), 0.5)
        assert e.value.code == "DEADLINE_EXCEEDED" and time.monotonic() - t < 2
        assert ch.call("/t.T/Echo", b"again", (), 5) == b"got again of 5"
    finally:
        server.stop(0)
    with pytest.raises(WireError) as e:
        ch.call("/t.T/Echo", b"x", (), 2)
    assert e.value.code == "UNAVAILABLE"
    server = _server(port)   # a server started again: the next call connects anew
    try:
        assert ch.call("/t.T/Echo", b"back", (), 5) == b"got back of 4"
    finally:
        server.stop(0)


def test_threads_each_call_on_a_connection_of_their_own(served):
    port, _ = served
    ch = Channel(f"127.0.0.1:{port}", 32 << 20)
    results: dict[int, bytes] = {}

    def caller(i: int) -> None:
        results[i] = ch.call("/t.T/Echo", b"sleep:0.3" if i == 0 else b"n%d" % i, (), 5)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(6)]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == {0: b"got sleep:0.3 of 9", **{i: b"got n%d of 2" % i for i in range(1, 6)}}
    assert time.monotonic() - t < 2


def test_a_call_in_flight_when_the_server_stops_gracefully_gets_its_reply():
    """A server that stops (airctld's stop: grace 2 s) sends a GOAWAY and finishes the calls it took:
    such a call's reply arrives, and the next call connects anew, never on the closing connection."""
    port = free_port()
    server = _server(port)
    ch = Channel(f"127.0.0.1:{port}", 32 << 20)
    assert ch.call("/t.T/Echo", b"warm", (), 5) == b"got warm of 4"   # (the connection is open)
    threading.Timer(0.3, lambda: server.stop(grace=2)).start()
    assert ch.call("/t.T/Echo", b"sleep:1", (), 5) == b"got sleep:1 of 7"
    server.wait_for_termination(5)
    server = _server(port)
    try:
        assert ch.call("/t.T/Echo", b"next", (), 5) == b"got next of 4"
    finally:
        server.stop(0)


def test_an_answer_before_the_whole_request_is_that_answer_every_time():
    """A server that refuses a request before reading all of it answers (trailers only) and resets the
    stream: the answer is what the caller gets, not the reset."""
    port = free_port()
    server = grpc.server(futures.ThreadPoolExecutor(2), options=[("grpc.max_receive_message_length", 1 << 20)])
    handler = grpc.unary_unary_rpc_method_handler(_echo, request_deserializer=None, response_serializer=None)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {"Echo": handler})])
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        ch = Channel(f"127.0.0.1:{port}", 32 << 20)
        codes = []
        for method in ["/t.T/Echo"] * 6 + ["/t.T/Nothing"] * 3:
            with pytest.raises(WireError) as e:
                ch.call(method, b"x" * (5 << 20), (), 10)
            codes.append(e.value.code)
        assert codes == ["RESOURCE_EXHAUSTED"] * 6 + ["UNIMPLEMENTED"] * 3
    finally:
        server.stop(0)


def _misbehaving(port: int, headers: list, trailers: list | None, body: bytes = b"",
                 action: str = "answer") -> threading.Thread:
    """A one-call HTTP/2 server (h2, server side) that answers with what it is given, or once it has
    the whole call closes the connection ("close") or sends a GOAWAY with an error that covers the call
    and stays connected ("goaway"); "at-once": it answers, but writes nothing until then, so that its
    acks of the client's settings and the answer arrive together."""
    import socket
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings
    listener = socket.create_server(("127.0.0.1", port))

    def serve():
        sock, _ = listener.accept()
        listener.close()
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None,
                                                                    validate_outbound_headers=False))
        conn.initiate_connection()
        if action == "goaway-early":   # (a window so small the call cannot all arrive before the GOAWAY)
            conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10})
        sock.sendall(conn.data_to_send())
        with sock:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived) and action == "goaway-early":
                        conn.close_connection(error_code=2, last_stream_id=event.stream_id)
                        sock.sendall(conn.data_to_send())
                        time.sleep(3)
                        return
                    if isinstance(event, h2.events.StreamEnded) and action == "close":
                        return
                    if isinstance(event, h2.events.StreamEnded) and action == "goaway":
                        conn.close_connection(error_code=2, last_stream_id=event.stream_id)
                        sock.sendall(conn.data_to_send())
                        time.sleep(3)
                        return
                    if isinstance(event, h2.events.StreamEnded):
                        conn.send_headers(event.stream_id, headers, end_stream=trailers is None)
                        if trailers is not None:
                            if body:
                                conn.send_data(event.stream_id, body)
                            conn.send_headers(event.stream_id, trailers, end_stream=True)
                        if action == "at-once":   # the settings' acks and the whole answer in one write
                            sock.sendall(conn.data_to_send())
                if action != "at-once":
                    sock.sendall(conn.data_to_send())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("headers, trailers, body, code", [
    ([(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", "²".encode())], None, b"",
     "UNKNOWN"),
    ([(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"9"),
      (b"grpc-message", b"bad \xff byte")], None, b"", "FAILED_PRECONDITION"),
    ([(b":status", b"200"), (b"content-type", b"application/grpc")], [(b"grpc-status", b"0")], b"\x01\0\0\0\x01x",
     "INTERNAL"),   # a compressed message, which was not asked for
    ([(b":status", b"200"), (b"content-type", b"application/grpc")], [(b"grpc-status", b"0")], b"\0\0\0\0\x09xy",
     "INTERNAL"),   # a length that lies
    ([(b":status", b"200"), (b"content-type", b"application/grpc")], [(b"other", b"1")], b"", "UNKNOWN"),
    ([(b":status", b"404")], None, b"", "UNAVAILABLE"),
])
def test_a_server_that_answers_badly_gives_one_error_never_a_traceback(headers, trailers, body, code):
    port = free_port()
    thread = _misbehaving(port, headers, trailers, body)
    with pytest.raises(WireError) as e:
        Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"hi", (), 5)
    assert e.value.code == code, e.value
    thread.join(5)


@pytest.mark.parametrize("action", ["close", "goaway"])
def test_a_call_whose_connection_goes_once_the_server_has_it_may_have_been_done(action):
    """The server had the whole call, then the connection went (closed, or a GOAWAY with an error that
    covers it): the caller is told at once that the call may have been carried out (it must look
    before it repeats a submission), and the call is not sent again."""
    port = free_port()
    thread = _misbehaving(port, [], None, action=action)
    t = time.monotonic()
    with pytest.raises(WireError) as e:
        Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"hi", (), 10)
    assert (e.value.code, e.value.maybe_done, e.value.unprocessed) == ("UNAVAILABLE", True, False), e.value
    assert time.monotonic() - t < 2   # (not the whole deadline)
    thread.join(5)


def test_a_call_the_server_never_had_all_of_is_not_said_to_be_maybe_done():
    """A GOAWAY with an error that names the call's stream, while most of the call still waits for the
    flow control window: the server never had it, and the caller is not told it may have been done."""
    port = free_port()
    thread = _misbehaving(port, [], None, action="goaway-early")
    with pytest.raises(WireError) as e:
        Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"x" * 100_000, (), 10)
    assert (e.value.code, e.value.maybe_done) == ("UNAVAILABLE", False), e.value
    thread.join(5)


def test_an_answer_in_frames_as_large_as_the_client_allows_that_comes_with_the_settings_ack_is_taken():
    """The client asks for frames of up to MAX_FRAME; a server answering fast on a new connection may
    send the ack of that setting and frames of that size in one write (h2 applies an ack only to the
    reads after the one that holds it: such a first answer once failed, "Received overlong frame")."""
    port = free_port()
    payload = bytes(range(256)) * 80   # over h2's default frame size, 16 KiB, in one DATA frame (and a
    #                                    write small enough to arrive in one read)
    thread = _misbehaving(port, [(b":status", b"200"), (b"content-type", b"application/grpc")],
                          [(b"grpc-status", b"0")], b"\0" + len(payload).to_bytes(4, "big") + payload,
                          action="at-once")
    assert Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"hi", (), 5) == payload
    thread.join(5)


def _grant(sock, window: int, connection: int, binding: str) -> tuple[int, int]:
    """WINDOW_UPDATEs only once a window is spent: the stream's back to 100 bytes, the connection's to
    30,000 (a client that sent past a window has then surely done so before its update)."""
    from hyperframe import frame as hf
    grants = b""
    if binding == "stream" and window <= 0:
        grants += hf.WindowUpdateFrame(1, window_increment=100 - window).serialize()
        window = 100
    if connection <= 0:
        grants += hf.WindowUpdateFrame(0, window_increment=30_000 - connection).serialize()
        connection = 30_000
    if grants:
        sock.sendall(grants)
    return window, connection


@pytest.mark.parametrize("binding", ["stream", "connection"])
def test_frames_of_every_kind_a_server_may_send_are_read_and_answered_as_http2_says(binding):
    """A server written with hyperframe and hpack (independent of aircli.wire) that sends what grpcio
    seldom does: a stream window of 100 bytes and WINDOW_UPDATEs as the request arrives (or a stream
    window opened wide at once, so that the connection's is the one that binds); a PING, which must
    come back as its ack; a frame of a kind HTTP/2 does not define; an informational response;
    response headers padded, with a priority, split over HEADERS and CONTINUATION, Huffman-coded and
    indexed; padded DATA; a PRIORITY frame; trailers that refer to the headers' table entries."""
    import socket
    import hpack as reference
    from hyperframe import frame as hf
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))
    payload = bytes(range(256)) * 30
    seen = {"request": b"", "ping_ack": None, "settings_ack": False, "over_window": False}

    def serve():
        sock, _ = listener.accept()
        listener.close()
        encoder = reference.Encoder()
        with sock:
            assert sock.recv(24, socket.MSG_WAITALL) == b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            sock.sendall(hf.SettingsFrame(0, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: 100}).serialize()
                         + hf.PingFrame(0, opaque_data=b"12345678").serialize()
                         + b"\0\0\x08\xee\0\0\0\0\0whatever")   # (hyperframe's ExtensionFrame writes no length)
            # what the client may send: 65535 on the stream and the connection, until it acks the settings
            # (RFC 9113 6.9.2: its stream window then moves by 100 - 65535, and may go below 0)
            window = connection = 65535
            ended = False
            while not (ended and seen["ping_ack"] is not None):
                header = sock.recv(9, socket.MSG_WAITALL)
                if len(header) < 9:
                    return
                f, length = hf.Frame.parse_frame_header(memoryview(header))
                f.parse_body(memoryview(sock.recv(length, socket.MSG_WAITALL) if length else b""))
                if isinstance(f, hf.SettingsFrame) and "ACK" in f.flags:
                    seen["settings_ack"] = True
                    window += 100 - 65535
                    window, connection = _grant(sock, window, connection, binding)
                elif isinstance(f, hf.HeadersFrame) and binding == "connection":
                    window += 1 << 24
                    sock.sendall(hf.WindowUpdateFrame(1, window_increment=1 << 24).serialize())
                elif isinstance(f, hf.PingFrame) and "ACK" in f.flags:
                    seen["ping_ack"] = f.opaque_data
                elif isinstance(f, hf.DataFrame):
                    window -= len(f.data)
                    connection -= len(f.data)
                    seen["over_window"] |= window < 0 or connection < 0
                    seen["request"] += f.data
                    ended = "END_STREAM" in f.flags
                    if not ended:
                        window, connection = _grant(sock, window, connection, binding)
            block = encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc"),
                                    (b"x-long", b"v" * 3000)], huffman=True)
            first = hf.HeadersFrame(1, data=block[:1000], flags=["PADDED", "PRIORITY"], pad_length=7,
                                    depends_on=0, stream_weight=15)
            rest = hf.ContinuationFrame(1, data=block[1000:], flags=["END_HEADERS"])
            message = b"\0" + len(payload).to_bytes(4, "big") + payload
            data = hf.DataFrame(1, data=message, flags=["PADDED"], pad_length=40)
            trailers = hf.HeadersFrame(1, data=encoder.encode([(b"grpc-status", b"0"), (b"x-long", b"v" * 3000)]),
                                       flags=["END_HEADERS", "END_STREAM"])
            informational = hf.HeadersFrame(1, data=encoder.encode([(b":status", b"100")]), flags=["END_HEADERS"])
            sock.sendall(informational.serialize() + first.serialize() + rest.serialize()
                         + hf.PriorityFrame(1, depends_on=0).serialize()
                         + data.serialize() + trailers.serialize())
            sock.recv(1024)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    request = bytes(range(7, 256)) * 600   # over the first 65535 bytes: the rest 100 at a time
    assert Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", request, (), 10) == payload
    thread.join(5)
    assert seen["request"] == b"\0" + len(request).to_bytes(4, "big") + request
    assert (seen["ping_ack"], seen["settings_ack"], seen["over_window"]) == (b"12345678", True, False)


def test_a_reply_split_anywhere_between_reads_is_put_back_together():
    """The server's answer (headers, two DATA frames, trailers) arrives in two reads, split at every
    kind of place: inside a frame's 9-byte header, inside a payload, at and next to frame boundaries."""
    import socket
    import hpack as reference
    from hyperframe import frame as hf
    payload = bytes(range(256)) * 40
    message = b"\0" + len(payload).to_bytes(4, "big") + payload
    encoder = reference.Encoder()
    frames = [hf.HeadersFrame(1, data=encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")]),
                              flags=["END_HEADERS"]).serialize(),
              hf.DataFrame(1, data=message[:3000]).serialize(), hf.DataFrame(1, data=message[3000:]).serialize(),
              hf.HeadersFrame(1, data=encoder.encode([(b"grpc-status", b"0")]),
                              flags=["END_HEADERS", "END_STREAM"]).serialize()]
    blob = b"".join(frames)
    bounds = [sum(map(len, frames[:i])) for i in range(1, len(frames))]
    splits = sorted({*range(1, 12), *(b + d for b in bounds for d in (-1, 0, 1, 4, 9, 10)), 1500, len(blob) - 1})
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))

    def serve():
        with listener:
            for k in splits:
                sock, _ = listener.accept()
                with sock:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    got = b""
                    while b"\x00\x01\x00\x00\x00\x01" not in got[24:]:   # (a DATA frame of stream 1 that ends it)
                        got += sock.recv(65536)
                    # (the client's settings acked first, so that its own frames are what it waits on)
                    sock.sendall(hf.SettingsFrame(0).serialize() + blob[:k])
                    time.sleep(0.02)
                    sock.sendall(blob[k:])
                    sock.recv(1024)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    for k in splits:
        assert Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"hi", (), 10) == payload, k
    thread.join(5)


def _h2frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """An HTTP/2 frame as RFC 9113 4.1 lays it out."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _client_frames(sock):
    """The client's frames, after its preface: (type, flags, stream, payload), until it closes."""
    import socket
    if len(sock.recv(24, socket.MSG_WAITALL)) < 24:
        return
    while True:
        header = sock.recv(9, socket.MSG_WAITALL)
        if len(header) < 9:
            return
        length = int.from_bytes(header[:3], "big")
        yield header[3], header[4], int.from_bytes(header[5:9], "big"), sock.recv(length, socket.MSG_WAITALL)


def _scripted(script, connections: int):
    """A server that runs script(connection number, socket, the client's frames) for each connection;
    the number of connections it took comes back in the list."""
    import socket
    listener = socket.create_server(("127.0.0.1", 0))
    taken: list[int] = []

    def serve():
        with listener:
            for i in range(connections):
                sock, _ = listener.accept()
                taken.append(i)
                with sock:
                    frames = _client_frames(sock)
                    sock.sendall(_h2frame(4, 0, 0))   # (its settings: none)
                    try:
                        script(i, sock, frames)
                    except OSError:
                        pass

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], taken


def _ended_stream(frames) -> int:
    for kind, flags, stream, _ in frames:
        if kind in (0, 1) and flags & 1:
            return stream
    raise AssertionError("the client closed before its call ended")


def _answer(encoder, stream: int, payload: bytes) -> bytes:
    message = b"\0" + len(payload).to_bytes(4, "big") + payload
    return (_h2frame(1, 4, stream, encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")]))
            + _h2frame(0, 0, stream, message) + _h2frame(1, 5, stream, encoder.encode([(b"grpc-status", b"0")])))


def test_a_call_the_server_never_took_is_sent_once_more_on_a_new_connection():
    """A GOAWAY that names an earlier stream, or a REFUSED_STREAM reset (RFC 9113 8.7), says the call was
    never processed: it is sent again, once, on a new connection; refused twice, the caller is told."""
    import hpack as reference

    def script(i, sock, frames):
        stream = _ended_stream(frames)
        if i in (0,):
            sock.sendall(_h2frame(7, 0, 0, (0).to_bytes(4, "big") + (0).to_bytes(4, "big")))   # GOAWAY, last 0
        elif i in (2, 4, 5):
            sock.sendall(_h2frame(3, 0, stream, (7).to_bytes(4, "big")))   # RST_STREAM, REFUSED_STREAM
        else:
            sock.sendall(_answer(reference.Encoder(), stream, b"done %d" % i))
        time.sleep(0.3)

    port, taken = _scripted(script, 6)
    assert Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"a", (), 5) == b"done 1"
    assert Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"b", (), 5) == b"done 3"
    with pytest.raises(WireError) as e:
        Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"c", (), 5)
    assert (e.value.code, e.value.maybe_done) == ("UNAVAILABLE", False) and "REFUSED_STREAM" in e.value.details
    assert taken == [0, 1, 2, 3, 4, 5]


def test_an_earlier_streams_frames_keep_the_header_table_and_reach_no_later_call():
    """Frames for a call that has ended still arrive: its header block is decoded (the table it adds to
    is the connection's), its DATA reaches no later call. A GOAWAY after an answer: the next call
    goes on a new connection."""
    import hpack as reference

    def script(i, sock, frames):
        encoder = reference.Encoder()
        stream = _ended_stream(frames)
        sock.sendall(_answer(encoder, stream, b"first"))
        if i == 1:
            return
        stream = _ended_stream(frames)
        late = _h2frame(1, 4, stream - 2, encoder.encode([(b"x-late", b"entry in the table")]))
        late += _h2frame(0, 1, stream - 2, b"\0\0\0\0\x05stale")
        message = b"\0\0\0\0\x06second"
        sock.sendall(late + _h2frame(1, 4, stream, encoder.encode([(b":status", b"200"),
                                                                    (b"x-late", b"entry in the table")]))
                     + _h2frame(0, 0, stream, message)
                     + _h2frame(1, 5, stream, encoder.encode([(b"grpc-status", b"0")]))
                     + _h2frame(7, 0, 0, stream.to_bytes(4, "big") + (0).to_bytes(4, "big")))
        time.sleep(1)

    port, taken = _scripted(script, 2)
    channel = Channel(f"127.0.0.1:{port}", 1 << 20)
    assert channel.call("/t.T/Echo", b"a", (), 5) == b"first"
    assert channel.call("/t.T/Echo", b"b", (), 5) == b"second"
    assert channel.call("/t.T/Echo", b"c", (), 5) == b"first"   # (the second connection's first answer)
    assert taken == [0, 1]


@pytest.mark.parametrize("flood", ["trailers", "huffman"])
def test_a_server_that_sends_header_blocks_without_end_is_cut_off_in_time_and_memory(flood):
    """Header blocks that never end the call: blocks after the response's headers are refused at the
    first; informational ones, each costly to decode (Huffman), are decoded only until the deadline."""
    import resource
    import hpack as reference
    value = "aceiost012" * 6000   # (60 KB of characters of 5-bit codes: a block of 38 KB, within the bounds)

    def script(i, sock, frames):
        encoder = reference.Encoder()
        stream = _ended_stream(frames)
        if flood == "trailers":
            sock.sendall(_h2frame(1, 4, stream, encoder.encode([(b":status", b"200")])))
        status = [(b":status", b"100")] if flood == "huffman" else []
        block = _h2frame(1, 4, stream, reference.Encoder().encode(status + [("x-flood", value)], huffman=True))
        for _ in range(10_000):   # (40 blocks a write: reads of MBs while the client decodes)
            sock.sendall(block * 40)

    port, _ = _scripted(script, 1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.monotonic()
    with pytest.raises(WireError) as e:   # (trailers: refused at the second block, whatever the deadline)
        Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"hi", (), 10 if flood == "trailers" else 1.5)
    assert e.value.code == ("INTERNAL" if flood == "trailers" else "DEADLINE_EXCEEDED"), e.value
    assert time.monotonic() - t < 3
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000   # KB


def _headers_block(encoder, stream: int, headers, flags: int = 4) -> bytes:
    return _h2frame(1, flags, stream, encoder.encode(headers))


@pytest.mark.parametrize("after, what", [
    (lambda s, e: _h2frame(0, 1, s, b"\0\0\0\0\0"), "DATA before the response's headers"),
    (lambda s, e: _headers_block(e, s + 2, [(b":status", b"200")]), "stream 3, which this side never opened"),
    (lambda s, e: _h2frame(0, 0, 2, b"x"), "stream 2, which this side never opened"),
    (lambda s, e: _h2frame(8, 0, 0, (0).to_bytes(4, "big")), "WINDOW_UPDATE of 0"),
    (lambda s, e: _h2frame(8, 0, 0, (2**31 - 1).to_bytes(4, "big")), "connection window over 2^31 - 1"),
    (lambda s, e: _h2frame(1, 4 | 0x20, s, b"\0\0"), "too short for its priority"),
    (lambda s, e: (2**20 + 1).to_bytes(3, "big") + b"\0\0\0\0\0\x01", "a frame of 1048577 bytes"),
    (lambda s, e: _h2frame(5, 4, s, (2).to_bytes(4, "big")), "PUSH_PROMISE"),
    (lambda s, e: _h2frame(1, 0, s, b"\x88") + _h2frame(9, 0, s, b"\0" * 70_000), "header block of more than 65536"),
    (lambda s, e: _h2frame(9, 4, s, b"\x88"), "CONTINUATION frame outside a header block"),
    (lambda s, e: _h2frame(1, 0, s, b"\x88") + _h2frame(6, 0, 0, b"12345678"), "a frame inside a header block"),
    (lambda s, e: _headers_block(e, s, [(b":status", b"200")]) + _headers_block(e, s, [(b"x", b"y")]),
     "a second header block that does not end the stream"),
])
def test_a_server_that_breaks_http2_fails_the_call_in_one_line_that_says_it_may_have_been_done(after, what):
    """Each rule of RFC 9113 this client holds a server to, broken once the whole call has left: an
    HTTP/2 error, the connection dropped, and the caller told the request may have been carried out."""
    import hpack as reference

    def script(i, sock, frames):
        sock.sendall(after(_ended_stream(frames), reference.Encoder()))
        time.sleep(1)

    port, _ = _scripted(script, 1)
    with pytest.raises(WireError) as e:
        Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"hi", (), 5)
    assert (e.value.code, e.value.maybe_done) == ("INTERNAL", True), e.value
    assert e.value.details.startswith("HTTP/2 error: ") and what in e.value.details, e.value


def test_what_follows_a_complete_answer_in_the_same_read_never_spoils_it():
    """An answer, then in the same write a frame that breaks HTTP/2, or a GOAWAY: the answer is the
    call's result, and the next call, having read what followed it, goes on a new connection."""
    import hpack as reference

    def script(i, sock, frames):
        stream = _ended_stream(frames)
        after = [_h2frame(8, 0, 0, (0).to_bytes(4, "big")), _h2frame(7, 0, 0, bytes(8)),
                 (2**20 + 1).to_bytes(3, "big") + bytes(6), b""][i]
        sock.sendall(_answer(reference.Encoder(), stream, b"done %d" % i) + after)
        time.sleep(0.3)   # (the next connection is taken after this one's end)

    port, taken = _scripted(script, 4)
    channel = Channel(f"127.0.0.1:{port}", 1 << 20)
    assert [channel.call("/t.T/Echo", b"a", (), 5) for _ in range(4)] == [b"done %d" % i for i in range(4)]
    assert taken == [0, 1, 2, 3]


@pytest.mark.parametrize("leftover", ["pings", "settings", "late block"])
def test_frames_that_follow_an_answer_are_taken_in_order_before_the_next_call(leftover):
    """Several whole frames after an answer, in its read: the next call takes them first, in order (acks,
    the header table), and goes on the same connection."""
    import hpack as reference

    def script(i, sock, frames):
        encoder = reference.Encoder()
        stream = _ended_stream(frames)
        answer = _answer(encoder, stream, b"first")   # (encoded first: the table follows the order sent)
        after = {"pings": lambda: _h2frame(6, 0, 0, b"1" * 8) + _h2frame(6, 0, 0, b"2" * 8),
                 "settings": lambda: _h2frame(4, 0, 0, (5).to_bytes(2, "big") + (1 << 20).to_bytes(4, "big"))
                 + _h2frame(6, 0, 0, b"3" * 8),
                 "late block": lambda: _headers_block(encoder, stream, [(b"x-late", b"in the table")])
                 + _h2frame(6, 0, 0, b"4" * 8)}[leftover]()
        sock.sendall(answer + after)
        for kind, flags, at, payload in frames:   # (the client's acks of the pings, and its next call)
            if kind == 6 and flags & 1:
                seen.append(payload)
            if kind == 1 and at == stream + 2:
                seen.append("the next call")
            if kind in (0, 1) and flags & 1 and at == stream + 2:
                break
        stream += 2
        sock.sendall(_headers_block(encoder, stream, [(b":status", b"200"), (b"x-late", b"in the table")])
                     + _h2frame(0, 0, stream, b"\0\0\0\0\x06second")
                     + _headers_block(encoder, stream, [(b"grpc-status", b"0")], flags=5))
        time.sleep(0.5)

    seen: list = []
    port, taken = _scripted(script, 1)
    channel = Channel(f"127.0.0.1:{port}", 1 << 20)
    assert [channel.call("/t.T/Echo", b"a", (), 5) for _ in range(2)] == [b"first", b"second"]
    assert taken == [0]
    assert seen == {"pings": [b"1" * 8, b"2" * 8], "settings": [b"3" * 8], "late block": [b"4" * 8]}[leftover] + \
        ["the next call"]


@pytest.mark.parametrize("after, code", [("goaway before it", "UNAVAILABLE"),
                                         ("goaway with an error, then refused", "UNAVAILABLE"),
                                         ("refused", "INTERNAL")])
def test_a_call_the_server_began_to_answer_is_never_sent_again(after, code):
    """A GOAWAY that names an earlier stream, or a REFUSED_STREAM (RFC 9113 8.7: such a call was never
    processed), once the call's answer has begun, contradicts itself; so does a REFUSED_STREAM after a
    GOAWAY whose error covers the call. The call may have been processed: no second connection."""
    import hpack as reference

    def script(i, sock, frames):
        stream = _ended_stream(frames)
        began = _headers_block(reference.Encoder(), stream, [(b":status", b"200")])
        sock.sendall({"goaway before it": began + _h2frame(7, 0, 0, bytes(8)),
                      "goaway with an error, then refused":
                          _h2frame(7, 0, 0, stream.to_bytes(4, "big") + (2).to_bytes(4, "big"))
                          + _h2frame(3, 0, stream, (7).to_bytes(4, "big")),
                      "refused": began + _h2frame(3, 0, stream, (7).to_bytes(4, "big"))}[after])
        time.sleep(1)

    port, taken = _scripted(script, 2)
    with pytest.raises(WireError) as e:
        Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"a", (), 3)
    assert (e.value.code, e.value.maybe_done, e.value.unprocessed) == (code, True, False), e.value
    assert taken == [0]


@pytest.mark.parametrize("whole", [True, False])
def test_a_deadline_after_the_whole_call_left_says_it_may_have_been_done(whole):
    """No answer in time: where the server had the whole call, it may carry it out; where most of it
    still waited on the flow control window, it cannot have."""
    def script(i, sock, frames):
        if not whole:   # (a stream window of 10 bytes, never opened further)
            sock.sendall(_h2frame(4, 0, 0, (4).to_bytes(2, "big") + (10).to_bytes(4, "big")))
        for _ in frames:
            pass

    port, _ = _scripted(script, 1)
    with pytest.raises(WireError) as e:
        Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"x" if whole else b"x" * 200_000, (), 0.7)
    assert (e.value.code, e.value.maybe_done) == ("DEADLINE_EXCEEDED", whole), e.value


def test_a_reply_made_of_small_pieces_of_large_reads_keeps_only_the_pieces():
    """1-byte DATA frames, each beside 256 KiB of a frame kind HTTP/2 does not define: what the call holds
    is the reply's bytes, not every read they came in (100 MB here)."""
    import tracemalloc
    import hpack as reference
    junk = _h2frame(0xEE, 0, 0, b"j" * (256 << 10))
    message = b"\0" + (400).to_bytes(4, "big") + bytes(i % 251 for i in range(400))

    def script(i, sock, frames):
        encoder = reference.Encoder()
        stream = _ended_stream(frames)
        sock.sendall(_headers_block(encoder, stream, [(b":status", b"200")]))
        for k in range(len(message)):
            sock.sendall(_h2frame(0, 0, stream, message[k:k + 1]) + junk)
        sock.sendall(_headers_block(encoder, stream, [(b"grpc-status", b"0")], flags=5))
        time.sleep(1)

    port, _ = _scripted(script, 1)
    tracemalloc.start()
    try:
        assert Channel(f"127.0.0.1:{port}", 1 << 20).call("/t.T/Echo", b"a", (), 30) == message[5:]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 << 20, peak
