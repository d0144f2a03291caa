"""HPACK (RFC 7541), as much as aircli.wire's calls need: a header block written without the dynamic
table or Huffman codes, and a decoder for whatever a server writes (static and dynamic tables, Huffman
strings). Pure: bytes in, bytes out, an HpackError for a block that breaks the format.
"""
from __future__ import annotations

DEFAULT_TABLE_SIZE = 4096   # SETTINGS_HEADER_TABLE_SIZE's initial value, which aircli.wire keeps
MAX_HEADER_LIST = 1 << 16   # a decoded block's size as RFC 9113 counts it (each field 32 more): past it, an error

# RFC 7541 appendix A, index 1 to 61: a name, then its value where it has one
_STATIC_TEXT = """:authority
:method GET
:method POST
:path /
:path /index.html
:scheme http
:scheme https
:status 200
:status 204
:status 206
:status 304
:status 400
:status 404
:status 500
accept-charset
accept-encoding gzip, deflate
accept-language
accept-ranges
accept
access-control-allow-origin
age
allow
authorization
cache-control
content-disposition
content-encoding
content-language
content-length
content-location
content-range
content-type
cookie
date
etag
expect
expires
from
host
if-match
if-modified-since
if-none-match
if-range
if-unmodified-since
last-modified
link
location
max-forwards
proxy-authenticate
proxy-authorization
range
referer
refresh
retry-after
server
set-cookie
strict-transport-security
transfer-encoding
user-agent
vary
via
www-authenticate"""
STATIC = tuple((name.encode(), value.encode()) for name, _, value in
               (line.partition(" ") for line in _STATIC_TEXT.splitlines()))

# RFC 7541 appendix B: the length in bits of each symbol's code (0 to 255, then 256, EOS), in base 36.
# The code is canonical (codes of one length are consecutive, in the order of their symbols, after the
# shorter ones), so the lengths make the codes.
_LENGTHS = ("dnsssssssoussussssssssusssssssss6aacd68baa8b8666555666666678f6cad67777777777777777777777878djde6f5656"
            "5666577666567655677777fbedskmkkmmmnmnnnnnonoomnonnnnlmnmnnomlkmmnnlnmmolmnnllmlnmnnkmmmnmmnqqkjmnmpqqq"
            "rrqopjlqrrqrollqqsrrrkoklmllnmmppooqnqrqqrrrrrsrrrrrqu")
EOS = 256


class HpackError(ValueError):
    pass


def encode(headers) -> bytes:
    """A header block of (name, value) str pairs: each a literal not added to any table, no Huffman
    codes. It opens with a dynamic table size update to 0, which is always within the server's limit,
    so nothing this side writes depends on the server's SETTINGS_HEADER_TABLE_SIZE."""
    out = bytearray(b"\x20")
    for name, value in headers:
        name, value = name.encode(), value.encode()
        out.append(0)   # a literal without indexing, with a new name: the name's string, then the value's
        out += _length(len(name)) + name + _length(len(value)) + value
    return bytes(out)


def _length(value: int) -> bytes:
    """A string's length: an integer in a 7-bit prefix (RFC 7541 5.1), its Huffman bit 0."""
    if value < 0x7F:
        return bytes((value,))
    out = bytearray(b"\x7f")
    value -= 0x7F
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class Decoder:
    """One connection's decoding context: its dynamic table lives from block to block, so every
    header block the server sends goes through it, in order, whatever stream it is for."""

    def __init__(self, limit: int = DEFAULT_TABLE_SIZE):
        self.limit = limit            # the most the server may set the table to (our setting)
        self.max_size = limit
        self.entries: list[tuple[bytes, bytes]] = []   # newest first: index 62 is entries[0]
        self.size = 0

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        headers: list[tuple[bytes, bytes]] = []
        total = pos = 0
        while pos < len(block):
            byte = block[pos]
            if byte & 0x80:     # an indexed field
                index, pos = _integer(block, pos, 7)
                field = self._entry(index)
            elif byte & 0x40:   # a literal added to the table
                name, value, pos = self._literal(block, pos, 6)
                field = (name, value)
                self._add(field)
            elif byte & 0x20:   # a dynamic table size update: only before the block's first field
                if headers:
                    raise HpackError("a dynamic table size update after a header field")
                size, pos = _integer(block, pos, 5)
                if size > self.limit:
                    raise HpackError(f"a dynamic table size of {size}, over the {self.limit} allowed")
                self.max_size = size
                self._evict()
                continue
            else:               # a literal not added (0000) or never to be (0001)
                name, value, pos = self._literal(block, pos, 4)
                field = (name, value)
            total += len(field[0]) + len(field[1]) + 32
            if total > MAX_HEADER_LIST:
                raise HpackError(f"a header list of more than {MAX_HEADER_LIST} bytes")
            headers.append(field)
        return headers

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 1 <= index <= len(STATIC):
            return STATIC[index - 1]
        if len(STATIC) < index <= len(STATIC) + len(self.entries):
            return self.entries[index - len(STATIC) - 1]
        raise HpackError(f"no header table entry {index}")

    def _literal(self, block: bytes, pos: int, bits: int) -> tuple[bytes, bytes, int]:
        index, pos = _integer(block, pos, bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _string(block, pos)
        value, pos = _string(block, pos)
        return name, value, pos

    def _add(self, field: tuple[bytes, bytes]) -> None:
        self.entries.insert(0, field)
        self.size += len(field[0]) + len(field[1]) + 32
        self._evict()   # (an entry larger than the whole table empties it, itself included)

    def _evict(self) -> None:
        while self.size > self.max_size:
            name, value = self.entries.pop()
            self.size -= len(name) + len(value) + 32


def _integer(block: bytes, pos: int, bits: int) -> tuple[int, int]:
    mask = (1 << bits) - 1
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        if pos >= len(block):
            raise HpackError("a header block that ends inside an integer")
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise HpackError("an integer over 2^32 in a header block")


def _string(block: bytes, pos: int) -> tuple[bytes, int]:
    if pos >= len(block):
        raise HpackError("a header block that ends before a string")
    huffman = block[pos] & 0x80
    length, pos = _integer(block, pos, 7)
    if pos + length > len(block):
        raise HpackError("a header block that ends inside a string")
    data = block[pos:pos + length]
    return (huffman_decode(data) if huffman else bytes(data)), pos + length


_codes: list | None = None


def _code_table() -> tuple[tuple, tuple]:
    """Per code length, (its first code, that code's place in `symbols`, how many codes have it)."""
    global _codes
    if _codes is None:
        lengths = [int(c, 36) for c in _LENGTHS]
        symbols = tuple(sorted(range(len(lengths)), key=lambda s: (lengths[s], s)))
        by_length: list = [None] * (max(lengths) + 1)
        code = 0
        for place, symbol in enumerate(symbols):
            length = lengths[symbol]
            if place:
                code = (code + 1) << (length - lengths[symbols[place - 1]])
            first = by_length[length]
            by_length[length] = (code, place, 1) if first is None else (first[0], first[1], first[2] + 1)
        _codes = [tuple(by_length), symbols]
    return _codes[0], _codes[1]


def huffman_decode(data: bytes) -> bytes:
    by_length, symbols = _code_table()
    out = bytearray()
    code = length = 0
    for byte in data:
        for shift in range(7, -1, -1):
            code = code << 1 | (byte >> shift) & 1
            length += 1
            entry = by_length[length] if length < len(by_length) else None
            if entry is not None and 0 <= code - entry[0] < entry[2]:
                symbol = symbols[entry[1] + code - entry[0]]
                if symbol == EOS:
                    raise HpackError("a Huffman string that holds EOS")
                out.append(symbol)
                code = length = 0
            elif length >= len(by_length):
                raise HpackError("not a Huffman code")
    if length > 7 or code != (1 << length) - 1:   # (the padding: at most 7 bits, EOS's first, all 1)
        raise HpackError("a Huffman string with bad padding")
    return bytes(out)
