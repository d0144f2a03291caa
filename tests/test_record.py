"""protos.record against what it stands in for: a class declared both as a Record and as a frozen
dataclass, with any fields and defaults, built from any arguments, behaves the same (made or refused,
equal, hashed, shown, changed by replace, never assigned to); and the configuration's records pickled."""
from __future__ import annotations

import dataclasses
import functools
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.protos import record

NAMES = ["a", "b", "c", "d", "e"]
VALUES = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.tuples(st.integers(0, 2)), st.none())


def _pair(spec: list[tuple[str, bool, object]]):
    """The same declaration twice: (name, has a default, the default) for each field."""
    body_record, body_dataclass = {"__annotations__": {}}, {"__annotations__": {}}
    for name, has_default, default in spec:
        for body in (body_record, body_dataclass):
            body["__annotations__"][name] = "int"
            if has_default:
                body[name] = default
    ours = type("R", (record.Record,), body_record)
    theirs = dataclasses.dataclass(frozen=True)(type("R", (), body_dataclass))
    return ours, theirs


SPECS = st.lists(st.sampled_from(NAMES), unique=True, max_size=5).flatmap(
    lambda names: st.integers(0, len(names)).flatmap(
        lambda first_default: st.tuples(*[st.tuples(st.just(n), st.just(i >= first_default), VALUES)
                                         for i, n in enumerate(names)]).map(list)))
CALLS = st.tuples(st.lists(VALUES, max_size=6),
                  st.dictionaries(st.sampled_from(NAMES + ["zz"]), VALUES, max_size=4))


def _outcome(cls, args, kwargs):
    try:
        return cls(*args, **kwargs)
    except TypeError:
        return TypeError


@settings(max_examples=400, deadline=None)
@given(spec=SPECS, calls=st.lists(CALLS, min_size=1, max_size=4), changes=st.dictionaries(
    st.sampled_from(NAMES + ["zz"]), VALUES, max_size=3))
def test_a_record_behaves_as_the_frozen_dataclass_of_the_same_declaration(spec, calls, changes):
    ours, theirs = _pair(spec)
    twin, twin_reference = _pair(spec)   # (the same declaration again: another class, so never equal)
    assert list(record.fields(ours)) == [f.name for f in dataclasses.fields(theirs)]
    made = []
    for args, kwargs in calls:
        mine, reference = _outcome(ours, args, kwargs), _outcome(theirs, args, kwargs)
        assert (mine is TypeError) == (reference is TypeError), (spec, args, kwargs)
        if mine is TypeError:
            continue
        assert repr(mine) == repr(reference)
        assert mine.__dict__ == dataclasses.asdict(reference)
        assert hash(mine) == hash(reference)
        with pytest.raises(AttributeError):
            mine.a = 1
        changed = _outcome(lambda **kw: record.replace(mine, **kw), (), changes)
        expected = _outcome(lambda **kw: dataclasses.replace(reference, **kw), (), changes)
        assert (changed is TypeError) == (expected is TypeError)
        if changed is not TypeError:
            assert repr(changed) == repr(expected)
        made.append((mine, reference))
        other, other_reference = _outcome(twin, args, kwargs), _outcome(twin_reference, args, kwargs)
        assert mine != other and reference != other_reference
    for mine, reference in made:   # equal where the dataclasses are equal, and hashed alike then
        for other, other_reference in made:
            assert (mine == other) == (reference == other_reference)
            if mine == other:
                assert hash(mine) == hash(other)


def test_a_field_without_a_default_after_one_with_is_refused_as_dataclasses_refuse_it():
    with pytest.raises(TypeError):
        type("Bad", (record.Record,), {"__annotations__": {"a": "int", "b": "int"}, "a": 1})


def test_configuration_records_copy_through_pickle():
    from air.protos.config import ControllerConfig, NodeConfig
    for r in (ControllerConfig(address="10.0.0.1:6817", operators=("ops",)), NodeConfig("n1", "10.0.0.2", port=7)):
        copy = pickle.loads(pickle.dumps(r))
        assert copy == r and type(copy) is type(r) and copy.__dict__ == r.__dict__


class Cached(record.Record):
    a: int
    b: str = "x"

    @functools.cached_property
    def doubled(self) -> int:
        return self.a * 2


def test_a_cached_property_is_not_a_field():
    """(A cached property lives in the instance's __dict__, beside the fields.)"""
    one, other = Cached(1), Cached(1)
    assert one.doubled == 2
    assert one == other and hash(one) == hash(other) and repr(one) == "Cached(a=1, b='x')"
    assert record.replace(one, b="y") == Cached(1, "y")
    assert pickle.loads(pickle.dumps(one)) == other


@pytest.mark.parametrize("body", [
    {"__annotations__": {"a": "list"}, "a": []},       # a default every record would share (dataclasses refuse it)
    {"__annotations__": {"a": "dict"}, "a": {}},
    {"__annotations__": {"a": int}},                    # a type that is not text: its module lacks the future import
])
def test_a_declaration_dataclasses_would_refuse_or_not_read_as_text_is_refused(body):
    with pytest.raises(TypeError):
        type("Bad", (record.Record,), body)


def test_a_classvar_is_not_a_field_and_a_subclass_adds_its_fields_after_its_parents():
    Base = type("Base", (record.Record,), {"__annotations__": {"a": "int", "k": "ClassVar[int]",
                                                               "t": "typing.ClassVar[int]"}, "k": 1, "t": 2})
    Sub = type("Sub", (Base,), {"__annotations__": {"b": "int"}, "b": 5})
    assert list(record.fields(Sub)) == ["a", "b"] and Sub(1) == Sub(1, 5) != Sub(1, 6)
    with pytest.raises(AttributeError):
        del Sub(1).a
