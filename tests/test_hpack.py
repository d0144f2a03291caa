"""aircli.hpack against the hpack library (python-hyper's, which h2 uses): every header block that
library writes, with its dynamic table and Huffman codes, reads back as the headers it was given;
every block aircli.hpack writes, that library reads as ours; anything else is an HpackError."""
import hpack as reference
import pytest
from hpack import huffman_constants
from hpack.table import HeaderTable
from hypothesis import given, settings
from hypothesis import strategies as st

from air.aircli import hpack

NAMES = st.one_of(st.sampled_from([b":status", b"content-type", b"grpc-status", b"grpc-message", b"te", b"date"]),
                  st.binary(min_size=1, max_size=40).map(lambda b: b.lower()))
VALUES = st.one_of(st.sampled_from([b"200", b"0", b"application/grpc", b""]), st.binary(max_size=300))
BLOCK = st.lists(st.tuples(NAMES, VALUES), max_size=8)


def test_the_tables_are_the_rfcs():
    assert hpack.STATIC == tuple(HeaderTable.STATIC_TABLE)
    lengths = [int(c, 36) for c in hpack._LENGTHS]
    assert lengths == list(huffman_constants.REQUEST_CODES_LENGTH)
    for symbol in range(256):   # each symbol alone, as the reference codes it
        assert hpack.huffman_decode(_huffman(bytes([symbol]))) == bytes([symbol])


def _huffman(data: bytes) -> bytes:
    bits = "".join(format(huffman_constants.REQUEST_CODES[b], f"0{huffman_constants.REQUEST_CODES_LENGTH[b]}b")
                   for b in data)
    bits += "1" * (-len(bits) % 8)
    return int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b""


@settings(max_examples=300, deadline=None)
@given(blocks=st.lists(st.tuples(BLOCK, st.booleans(), st.sampled_from([4096, 4096, 300, 0])), max_size=6))
def test_blocks_the_reference_writes_read_back_in_order_on_one_connection(blocks):
    encoder, decoder = reference.Encoder(), hpack.Decoder()
    for headers, huffman, table_size in blocks:
        encoder.header_table_size = table_size   # (a size update opens the next block)
        block = encoder.encode(headers, huffman=huffman)
        assert decoder.decode(block) == headers


@settings(max_examples=200, deadline=None)
@given(headers=st.lists(st.tuples(st.text(min_size=1, max_size=200), st.text(max_size=300)), max_size=8))
def test_blocks_written_here_are_read_by_the_reference(headers):
    decoder = reference.Decoder()
    decoder.max_header_list_size = 1 << 20
    for _ in range(2):   # (and a second block on the same connection)
        got = decoder.decode(hpack.encode(headers), raw=True)
        assert got == [(n.encode(), v.encode()) for n, v in headers]


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_any_bytes_are_headers_or_an_hpack_error(data):
    try:
        hpack.Decoder().decode(data)
    except hpack.HpackError:
        pass


@pytest.mark.parametrize("block, what", [
    (b"\x80", "no header table entry 0"),
    (b"\xbe", "no header table entry 62"),                 # an empty dynamic table
    (b"\x3f\xe2\x1f", "a dynamic table size of 4097"),   # over the 4096 this side allows
    (b"\x88\x20", "after a header field"),
    (b"\x40\x85" + _huffman(b"abc")[:1], "ends inside a string"),
    (b"\x40\x81\x00\x00", "bad padding"),                  # 8 zero bits: not a code's end, not padding
    (b"\x40\x84\xff\xff\xff\xff\x00", "EOS"),
    (b"\x1f\xff\xff\xff\xff\xff", "over 2^32"),
    (b"\x00\x01a\x7f", "ends inside an integer"),
])
def test_a_broken_block_is_an_hpack_error(block, what):
    with pytest.raises(hpack.HpackError) as e:
        hpack.Decoder().decode(block)
    assert what in str(e.value)


def test_the_dynamic_table_keeps_to_its_size_and_a_header_list_to_its_bound():
    encoder, decoder = reference.Encoder(), hpack.Decoder()
    for i in range(200):   # entries of 32 + 4 + 40 bytes: at most 53 fit in 4096
        headers = [(b"x-%02d" % (i % 100), b"v" * 40)]
        assert decoder.decode(encoder.encode(headers, huffman=False)) == headers
        assert decoder.size <= 4096 and len(decoder.entries) <= 53
    encoder.header_table_size = 0   # the server shrinks the table: what it held is gone
    assert decoder.decode(encoder.encode([(b"a", b"b")])) == [(b"a", b"b")]
    assert (decoder.size, decoder.entries) == (0, [])
    huge = reference.Encoder().encode([(b"a", b"b" * 5000)] * 220, huffman=False)
    with pytest.raises(hpack.HpackError, match="header list of more than"):
        hpack.Decoder().decode(huge)
