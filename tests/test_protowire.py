"""protos.protowire against protobuf itself: the schemas say what air.proto says, and the bytes
written are the deterministic serialization a credential is bound to."""
import math

import pytest
from google.protobuf.descriptor import FieldDescriptor as FD
from hypothesis import example, given, settings
from hypothesis import strategies as st

from air.protos import air_pb2 as pb
from air.protos import protowire as w
from air.protos import schemas

KINDS = {FD.TYPE_STRING: w.STRING, FD.TYPE_BYTES: w.BYTES, FD.TYPE_BOOL: w.BOOL, FD.TYPE_UINT32: w.UINT32,
         FD.TYPE_UINT64: w.UINT64, FD.TYPE_INT32: w.INT32, FD.TYPE_INT64: w.INT64, FD.TYPE_ENUM: w.ENUM,
         FD.TYPE_DOUBLE: w.DOUBLE, FD.TYPE_MESSAGE: w.MESSAGE}


def _described(fd) -> tuple:
    """What air.proto says of a field, in protowire's terms."""
    repeated = fd.is_repeated
    if fd.type == FD.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry:
        key, value = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        return fd.name, fd.number, w.MAP, False, None, KINDS[key.type], KINDS[value.type]
    sub = fd.message_type.name if fd.type == FD.TYPE_MESSAGE else None
    return fd.name, fd.number, KINDS[fd.type], repeated, sub, "", ""


def _listed(f: w.Field) -> tuple:
    return f.name, f.number, f.kind, f.repeated, f.message.name if f.message else None, f.key, f.value


def _messages():
    seen, todo = {}, [m for pair in schemas.RPCS.values() for m in pair]
    while todo:
        m = todo.pop()
        if m.name not in seen:
            seen[m.name] = m
            todo += [f.message for f in m.fields or () if f.message]
    return list(seen.values())


@pytest.mark.parametrize("message", _messages(), ids=lambda m: m.name)
def test_each_schema_is_what_air_proto_says(message):
    described = pb.DESCRIPTOR.message_types_by_name[message.name]
    if message.fields is None:   # (kept as bytes: only its name is said)
        return
    assert sorted(_listed(f) for f in message.fields) == sorted(_described(fd) for fd in described.fields)


def test_each_rpc_takes_and_gives_what_air_proto_says():
    service = pb.DESCRIPTOR.services_by_name["Controller"]
    assert service.full_name == schemas.SERVICE
    for name, (request, reply) in schemas.RPCS.items():
        method = service.methods_by_name[name]
        assert (method.input_type.name, method.output_type.name) == (request.name, reply.name)


# ---------------------------------------------------------------- values

_TEXT = st.text(alphabet="ab\u00e9\U0001f600", max_size=4) | st.text(max_size=12)   # (keys that begin others)
_NUMBERS = {w.BOOL: st.booleans(), w.UINT32: st.integers(0, 2**32 - 1), w.UINT64: st.integers(0, 2**64 - 1),
            w.INT32: st.integers(-2**31, 2**31 - 1), w.INT64: st.integers(-2**63, 2**63 - 1),
            w.ENUM: st.integers(0, 3), w.STRING: _TEXT, w.BYTES: st.binary(max_size=12),
            w.DOUBLE: st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, 1e-300])}


_JOBS = st.builds(lambda i, user, phase: pb.Job(job_id=i, user=user, phase=phase).SerializeToString(),
                  st.integers(0, 2**64 - 1), _TEXT, st.integers(0, 4))


def _values(message: w.Message, depth: int = 0):
    """Some of a message's fields, each with a value of its kind (defaults included); a message kept
    as bytes, as protobuf writes one."""
    if message.fields is None:
        return _JOBS
    fields = {}
    for f in message.fields:
        if f.kind == w.MAP:
            value = st.dictionaries(_NUMBERS[f.key], _NUMBERS[f.value], max_size=4)
        elif f.kind == w.MESSAGE:
            one = _values(f.message, depth + 1) if depth < 2 else st.just({})
            value = st.lists(one, max_size=3) if f.repeated else one
        else:
            value = st.lists(_NUMBERS[f.kind], max_size=4) if f.repeated else _NUMBERS[f.kind]
        fields[f.name] = value
    return st.fixed_dictionaries({}, optional=fields)


def _protobuf(message: w.Message, values: dict):
    """The same values, set on protobuf's message."""
    if message.fields is None:
        return getattr(pb, message.name).FromString(values)
    out = getattr(pb, message.name)()
    for f in message.fields:
        if f.name not in values:
            continue
        value = values[f.name]
        if f.kind == w.MAP:
            getattr(out, f.name).update(value)
        elif f.kind == w.MESSAGE and f.repeated:
            getattr(out, f.name).extend(_protobuf(f.message, one) for one in value)
        elif f.kind == w.MESSAGE:
            getattr(out, f.name).CopyFrom(_protobuf(f.message, value))
        elif f.repeated:
            getattr(out, f.name).extend(value)
        else:
            setattr(out, f.name, value)
    return out


def _read(message: w.Message, got) -> dict:
    """Every field of a protobuf message, as protowire.decode gives them."""
    if message.fields is None:
        return got.SerializeToString()
    out = {}
    for f in message.fields:
        value = getattr(got, f.name)
        if f.kind == w.MAP:
            out[f.name] = dict(value)
        elif f.kind == w.MESSAGE and f.repeated:
            out[f.name] = [_read(f.message, one) for one in value]
        elif f.kind == w.MESSAGE:
            out[f.name] = _read(f.message, value) if got.HasField(f.name) else None
        else:
            out[f.name] = list(value) if f.repeated else value
    return out


@settings(max_examples=200, deadline=None)
@given(_values(schemas.JobFilter))
@example({"phases": [1, 4], "results": [3], "job_ids": [2**64 - 1], "array_tasks": [{}, {"task_id": 7}]})
def test_filters_are_encoded_as_protobuf_encodes_them(values):
    assert w.encode(schemas.JobFilter, values) == \
        _protobuf(schemas.JobFilter, values).SerializeToString(deterministic=True)


@settings(max_examples=300, deadline=None)
@given(_values(schemas.SubmitRequest))
@example({"job": {"environment": {"": ""}, "rlimits": {"NOFILE": 0, "": -1}, "nice": -1, "begin_time": -0.0}})
@example({"job": {}})
@example({"job": {"environment": {"a": "1", "ab": "2", "b": "3", "": "4", "é": "5", "e": "6"}}})
def test_submit_requests_are_encoded_as_protobuf_encodes_them(values):
    assert w.encode(schemas.SubmitRequest, values) == \
        _protobuf(schemas.SubmitRequest, values).SerializeToString(deterministic=True)


@settings(max_examples=200, deadline=None)
@given(_values(schemas.CancelRequest))
@example({"filter": {"uids": [0]}, "signal": -1, "steps_only": True})
def test_cancel_requests_are_encoded_as_protobuf_encodes_them(values):
    assert w.encode(schemas.CancelRequest, values) == \
        _protobuf(schemas.CancelRequest, values).SerializeToString(deterministic=True)


@pytest.mark.parametrize("message", [schemas.SubmitRequest, schemas.SubmitReply, schemas.JobFilter,
                                     schemas.ListJobsReply, schemas.CancelRequest, schemas.CancelReply],
                         ids=lambda m: m.name)
def test_what_protobuf_writes_is_read_back(message):
    @settings(max_examples=200, deadline=None)
    @given(_values(message))
    def check(values):
        sent = _protobuf(message, values)
        assert w.decode(message, sent.SerializeToString()) == _read(message, sent)
    check()


def test_a_job_request_as_airbatch_sends_it():
    values = {"job": {"name": "train", "script": "#!/bin/sh\necho é\n", "argv": ["a", ""], "nodes": 2,
                      "environment": {"PATH": "/bin", "Z": "", "A": "1"}, "rlimits": {"NOFILE": 1024, "CORE": -1},
                      "het": [{"name": "a", "nodes": 1}, {}], "begin_time": 1.5e9, "nice": -5, "hold": True}}
    assert w.encode(schemas.SubmitRequest, values) == \
        _protobuf(schemas.SubmitRequest, values).SerializeToString(deterministic=True)
    assert pb.SubmitRequest.FromString(w.encode(schemas.SubmitRequest, values)).job.environment["A"] == "1"


def test_bad_values_and_bad_bytes_are_refused():
    with pytest.raises(KeyError, match="JobRequest has no field 'nme'"):
        w.encode(schemas.JobRequest, {"nme": "x"})
    with pytest.raises(ValueError, match="out of range for uint32"):
        w.encode(schemas.JobRequest, {"nodes": -1})
    with pytest.raises(ValueError, match="out of range for int32"):
        w.encode(schemas.JobRequest, {"nice": 2**31})
    # a value that is not UTF-8 text (what os.environ makes of such bytes) is named, with its key
    with pytest.raises(ValueError, match=r"^SubmitRequest.job: JobRequest.environment: \['BAD'\]: not UTF-8 text$"):
        w.encode(schemas.SubmitRequest, {"job": {"environment": {"OK": "1", "BAD": "\udcff"}}})
    with pytest.raises(ValueError, match=r"^JobFilter.uids: 4294967296 is out of range for uint32"):
        w.encode(schemas.JobFilter, {"uids": [2**32]})
    reply = pb.SubmitReply(job_id=300, message="é").SerializeToString()   # 08 ac 02 12 02 c3 a9
    for cut in (1, 2, 4, 5):   # (within a field: a cut between two is a shorter message)
        with pytest.raises(w.DecodeError, match="truncated"):
            w.decode(schemas.SubmitReply, reply[:cut])
    assert w.decode(schemas.SubmitReply, reply[:3]) == {"job_id": 300, "message": ""}
    with pytest.raises(w.DecodeError, match="not UTF-8"):
        w.decode(schemas.SubmitReply, b"\x12\x01\xff")
    with pytest.raises(w.DecodeError, match="wire type"):
        w.decode(schemas.SubmitReply, b"\x0a\x00")   # job_id as bytes
    # a field it does not know is skipped, as protobuf skips it
    assert w.decode(schemas.SubmitReply, b"\x08\x07" + b"\x1a\x02hi" + b"\x25" + bytes(4)) == \
        {"job_id": 7, "message": ""}
    assert math.isnan(w.decode(w.Message("D", (w.Field("d", 1, w.DOUBLE),)), b"\x09" + bytes(6) + b"\xf8\x7f")["d"])


def test_a_field_asked_as_sent_is_the_bytes_that_came_unchecked():
    rows = "  7 gpu  job  alice PD  0:00  1 (Priority)\n".encode() * 3
    data = pb.ListJobsReply(rendered=rows.decode()).SerializeToString()
    got = w.decode(schemas.ListJobsReply, data, as_sent=frozenset({"rendered"}))
    assert isinstance(got["rendered"], memoryview) and bytes(got["rendered"]) == rows
    assert w.decode(schemas.ListJobsReply, data)["rendered"] == rows.decode()   # (a str otherwise)
    bad = b"\x12\x02\xff\xfe"   # field 2, two bytes that are not UTF-8
    assert bytes(w.decode(schemas.ListJobsReply, bad, as_sent=frozenset({"rendered"}))["rendered"]) == b"\xff\xfe"
    with pytest.raises(w.DecodeError, match="not UTF-8"):
        w.decode(schemas.ListJobsReply, bad)
    with pytest.raises(w.DecodeError, match="wire type 0"):   # (its wire type is checked all the same)
        w.decode(schemas.ListJobsReply, b"\x10\x05", as_sent=frozenset({"rendered"}))
