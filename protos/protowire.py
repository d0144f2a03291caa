"""Protocol buffers' wire format for the few messages a short command sends and reads without
importing protobuf, whose import (its descriptor pool and pure-Python fallbacks, whatever the
backend) is about a fifth of an airbatch call.

A message is a dict from field names to values; its schema a `Message` (protos/schemas.py, which
tests check field by field against air.proto). `encode` writes what protobuf's deterministic
serialization writes (fields in number order, defaults left out, packed numbers, map entries in key
order), byte for byte: a credential is bound to the SHA-256 of those bytes, which the receiver
computes again from the message it parsed. `decode` reads any valid encoding of a message, skipping
fields it does not know, and gives every field of the schema (its default where absent).
Pure: no I/O."""
from __future__ import annotations

import struct

# kinds of field, by how they cross the wire
STRING, BYTES, BOOL, UINT32, UINT64, INT32, INT64, ENUM, DOUBLE, MESSAGE, MAP = (
    "string", "bytes", "bool", "uint32", "uint64", "int32", "int64", "enum", "double", "message", "map")
_VARINTS = {BOOL, UINT32, UINT64, INT32, INT64, ENUM}
_LIMITS = {BOOL: (0, 1), UINT32: (0, 2**32 - 1), UINT64: (0, 2**64 - 1), INT32: (-2**31, 2**31 - 1),
           INT64: (-2**63, 2**63 - 1), ENUM: (-2**31, 2**31 - 1)}


class DecodeError(ValueError):
    pass


class Field:
    """One field: its name, number and kind; MESSAGE: its schema; MAP: the kinds of key and value.
    (A plain class: a dataclass's making costs an import more than the rest of this module.)"""
    __slots__ = ("name", "number", "kind", "repeated", "message", "key", "value")

    def __init__(self, name: str, number: int, kind: str, repeated: bool = False, message: Message | None = None,
                 key: str = "", value: str = ""):
        self.name, self.number, self.kind, self.repeated = name, number, kind, repeated
        self.message, self.key, self.value = message, key, value


class Message:
    """A message's schema; without fields, one kept as its bytes (read as bytes, written as given)."""
    __slots__ = ("name", "fields")

    def __init__(self, name: str, fields: tuple[Field, ...] | None):
        self.name, self.fields = name, fields


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64   # (negative int32 and int64 take ten bytes, as two's complement)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _scalar(kind: str, value) -> bytes:
    """A value's payload, without its tag."""
    if kind == STRING:
        data = value.encode()
        return _varint(len(data)) + data
    if kind == BYTES:
        return _varint(len(value)) + bytes(value)
    if kind == DOUBLE:
        return struct.pack("<d", value)
    low, high = _LIMITS[kind]
    value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{value} is out of range for {kind}")
    return _varint(value)


def _wiretype(kind: str) -> int:
    return 0 if kind in _VARINTS else 1 if kind == DOUBLE else 2


def _is_default(kind: str, value) -> bool:
    if kind == DOUBLE:
        return struct.pack("<d", value) == bytes(8)   # (-0.0 is not the default: it is sent)
    return not value


def _entry(key_kind: str, value_kind: str, key, value) -> bytes:
    """A map entry: key and value both written, defaults too (as protobuf writes them)."""
    return (_varint(1 << 3 | _wiretype(key_kind)) + _scalar(key_kind, key)
            + _varint(2 << 3 | _wiretype(value_kind)) + _scalar(value_kind, value))


class _map_order:
    """The order protobuf's deterministic serialization (upb) writes a map's string keys in: by their
    bytes, but of two keys where one begins the other, the longer first ("ab" before "a")."""
    __slots__ = ("key",)

    def __init__(self, key: str):
        self.key = key.encode()

    def __lt__(self, other: _map_order) -> bool:
        a, b = self.key, other.key
        n = min(len(a), len(b))
        return a[:n] < b[:n] if a[:n] != b[:n] else len(a) > len(b)


def encode(schema: Message, values: dict) -> bytes:
    """`values` (field name -> value; a name the schema lacks is a KeyError) in wire format."""
    known = {f.name: f for f in schema.fields}
    for name in values:
        if name not in known:
            raise KeyError(f"{schema.name} has no field {name!r}")
    out = bytearray()
    for f in sorted(schema.fields, key=lambda f: f.number):
        if f.name not in values:
            continue
        try:
            out += _field(f, values[f.name])
        except UnicodeEncodeError:   # (a lone surrogate: what a non-UTF-8 byte becomes in a str)
            raise ValueError(f"{schema.name}.{f.name}: not UTF-8 text") from None
        except ValueError as e:
            raise ValueError(f"{schema.name}.{f.name}: {e}") from None
    return bytes(out)


def _field(f: Field, value) -> bytes:
    """One field's tags and payloads (nothing for a default)."""
    out = bytearray()
    if f.kind == MAP:
        if f.key != STRING:
            raise NotImplementedError(f"maps with {f.key} keys")
        for key in sorted(value, key=_map_order):
            try:
                body = _entry(f.key, f.value, key, value[key])
            except UnicodeEncodeError:   # (named by its key only: the value may be a secret)
                raise ValueError(f"[{key.encode(errors='replace').decode()!r}]: not UTF-8 text") from None
            except ValueError as e:
                raise ValueError(f"[{key!r}]: {e}") from None
            out += _varint(f.number << 3 | 2) + _varint(len(body)) + body
    elif f.kind == MESSAGE:
        for one in (value if f.repeated else [value]):
            body = bytes(one) if f.message.fields is None else encode(f.message, one)
            out += _varint(f.number << 3 | 2) + _varint(len(body)) + body
    elif f.repeated and f.kind in (STRING, BYTES):
        for one in value:
            out += _varint(f.number << 3 | 2) + _scalar(f.kind, one)
    elif f.repeated:   # numbers: packed
        if value:
            body = b"".join(_scalar(f.kind, one) for one in value)
            out += _varint(f.number << 3 | 2) + _varint(len(body)) + body
    elif not _is_default(f.kind, value):
        out += _varint(f.number << 3 | _wiretype(f.kind)) + _scalar(f.kind, value)
    return bytes(out)


def _read_varint(data: memoryview, at: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise DecodeError("a truncated or overlong varint")
        b = data[at]
        at += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n & (2**64 - 1), at


def _fields(data: memoryview):
    """(number, wire type, value) for each field: an int for varints and fixed widths, else a view."""
    at = 0
    while at < len(data):
        tag, at = _read_varint(data, at)
        number, wiretype = tag >> 3, tag & 7
        if number == 0:
            raise DecodeError("field number 0")
        if wiretype == 0:
            value, at = _read_varint(data, at)
        elif wiretype in (1, 5):
            width = 8 if wiretype == 1 else 4
            if at + width > len(data):
                raise DecodeError("a truncated fixed-width field")
            value, at = data[at:at + width], at + width
        elif wiretype == 2:
            size, at = _read_varint(data, at)
            if at + size > len(data):
                raise DecodeError("a truncated length-delimited field")
            value, at = data[at:at + size], at + size
        else:
            raise DecodeError(f"wire type {wiretype}")
        yield number, wiretype, value


def _default(f: Field):
    if f.kind == MAP:
        return {}
    if f.repeated:
        return []
    return {STRING: "", BYTES: b"", DOUBLE: 0.0, MESSAGE: None, BOOL: False}.get(f.kind, 0)


def _number(kind: str, n: int):
    if kind == BOOL:
        return n != 0
    if kind in (INT32, ENUM):
        n &= 2**32 - 1
        return n - 2**32 if n >= 2**31 else n
    if kind == INT64:
        return n - 2**64 if n >= 2**63 else n
    if kind == UINT32:
        return n & (2**32 - 1)
    return n


def _value(kind: str, wiretype: int, raw, message: Message | None = None, as_sent: bool = False):
    expected = _wiretype(kind)
    if wiretype != expected:
        raise DecodeError(f"a {kind} field sent as wire type {wiretype}")
    if as_sent:
        return raw
    if kind == STRING:
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise DecodeError("a string that is not UTF-8") from None
    if kind == BYTES:
        return bytes(raw)
    if kind == DOUBLE:
        return struct.unpack("<d", raw)[0]
    if kind == MESSAGE:
        return bytes(raw) if message.fields is None else decode(message, raw)
    return _number(kind, raw)


def decode(schema: Message, data, as_sent: frozenset[str] = frozenset()) -> dict:
    """The message in `data`: every field of the schema, a default where absent (None for a
    message), the last value for a repeated scalar field; DecodeError for bytes that are not one.
    `as_sent`: singular length-delimited fields given as the memoryview of their bytes in `data`,
    unchecked (airq writes its megabytes of rows as they came)."""
    by_number = {f.number: f for f in schema.fields}
    out = {f.name: _default(f) for f in schema.fields}
    for number, wiretype, raw in _fields(memoryview(data)):
        f = by_number.get(number)
        if f is None:
            continue
        if f.kind == MAP:
            if wiretype != 2:
                raise DecodeError(f"a map entry sent as wire type {wiretype}")
            entry = {1: _default(Field("", 1, f.key)), 2: _default(Field("", 2, f.value))}
            for n, w, r in _fields(raw):
                if n in entry:
                    entry[n] = _value(f.key if n == 1 else f.value, w, r)
            out[f.name][entry[1]] = entry[2]
        elif f.repeated and wiretype == 2 and f.kind not in (STRING, BYTES, MESSAGE):   # packed
            for n, w, r in _packed(f.kind, raw):
                out[f.name].append(_value(f.kind, w, r))
        elif f.repeated:
            out[f.name].append(_value(f.kind, wiretype, raw, f.message))
        else:
            out[f.name] = _value(f.kind, wiretype, raw, f.message, f.name in as_sent)
    return out


def _packed(kind: str, raw: memoryview):
    at = 0
    while at < len(raw):
        if kind == DOUBLE:
            if at + 8 > len(raw):
                raise DecodeError("a truncated packed double")
            yield 0, 1, raw[at:at + 8]
            at += 8
        else:
            value, at = _read_varint(raw, at)
            yield 0, 0, value
