"""Frozen records for what the short commands load: the configuration, airbatch's option table, a
caller's identity. Declared as a frozen dataclass is (annotated fields, defaults after the fields
without), made without the dataclasses module: its import (with inspect, ast and dis) and the code
it compiles for each class were about a quarter of a short command's start (`python -X importtime`:
17 ms to import, 20 ms for the configuration's seven classes, on a 130 ms airbatch). Only what a
record needs: construction by position or keyword, equality, a hash, a repr, no assignment, and
`fields` and `replace` in place of dataclasses'.
"""
from __future__ import annotations


class FrozenError(AttributeError):
    pass


class Record:
    """A frozen record: subclass it and annotate the fields, as for `@dataclass(frozen=True)`."""

    _fields: tuple[str, ...] = ()
    _types: dict[str, str] = {}
    _defaults: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("__annotations__", {})
        if any(not isinstance(kind, str) for kind in declared.values()):   # (the types are read as text)
            raise TypeError(f"{cls.__name__}: a record's module needs `from __future__ import annotations`")
        annotations = {name: kind for name, kind in declared.items()
                       if not kind.startswith(("ClassVar", "typing.ClassVar"))}
        types = {**cls._types, **annotations}   # (a subclass's fields after its parent's)
        fields = list(types)
        defaults = {**cls._defaults, **{name: cls.__dict__[name] for name in annotations if name in cls.__dict__}}
        for name, default in defaults.items():   # (as dataclasses: a default shared by every record is immutable)
            if type(default).__hash__ is None:
                raise TypeError(f"{cls.__name__}: field {name} has a mutable default ({type(default).__name__})")
        for before, after in zip(fields, fields[1:]):
            if before in defaults and after not in defaults:
                raise TypeError(f"{cls.__name__}: field {after} without a default follows one with a default")
        cls._fields = tuple(fields)
        cls._types = types
        cls._defaults = defaults

    def __init__(self, *args, **kwargs):
        fields = self._fields
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__} takes {len(fields)} fields, not {len(args)}")
        values = dict(zip(fields, args))
        for name, value in kwargs.items():
            if name not in self._types:
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            if name in values:
                raise TypeError(f"{type(self).__name__} got field {name!r} twice")
            values[name] = value
        if len(values) < len(fields):
            for name in fields:
                if name not in values:
                    if name not in self._defaults:
                        raise TypeError(f"{type(self).__name__} needs field {name!r}")
                    values[name] = self._defaults[name]
        object.__setattr__(self, "__dict__", {name: values[name] for name in fields})

    def __setattr__(self, name, value):
        raise FrozenError(f"cannot assign to field {name!r} of a {type(self).__name__}")

    def __delattr__(self, name):
        raise FrozenError(f"cannot delete field {name!r} of a {type(self).__name__}")

    def _values(self) -> tuple:
        values = self.__dict__   # (the fields only: a cached property also lives in __dict__)
        return tuple(values[name] for name in self._fields)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self):
        return hash(self._values())

    def __repr__(self):
        inner = ", ".join(f"{name}={self.__dict__[name]!r}" for name in self._fields)
        return f"{type(self).__name__}({inner})"

    def __reduce__(self):
        return type(self), self._values()


def fields(record) -> dict[str, str]:
    """A record's (or record class's) field names, in order, with their annotations as text."""
    return dict(record._types)


def replace(record, **changes):
    """A copy of `record` with some fields changed."""
    return type(record)(**{**{name: record.__dict__[name] for name in record._fields}, **changes})
