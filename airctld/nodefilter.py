"""Which nodes a job may run on, from what it asked (pure): -w/--nodelist (all of these nodes are in
the allocation), -x/--exclude (none of these is), -C/--constraint (node features) and --exclusive
(whole nodes, shared with no other job).

A constraint is a feature name, or constraints joined by & (and) and | (or), with & binding
tighter, and parentheses: `a100&ib`, `a100|h100`, `(a100|h100)&ib`. Slurm's other forms (counts
`a*2`, matching or `[a|b]`, `!a`) are refused with one line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from air.protos.limits import MAX_CONSTRAINT_CHARS

MAX_TERMS = 64   # feature names in one constraint: each pass works it out over every node
_TOKEN = re.compile(r"\s*(?:([A-Za-z0-9_.-]+)|([&|()]))")


class ConstraintError(ValueError):
    pass


# An expression is a feature name (str), or ("&" | "|", [expressions]).
Expr = object


def parse_constraint(text: str) -> Expr | None:
    """The constraint's expression, or None for an empty one; ConstraintError says what is wrong."""
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise ConstraintError(f"--constraint: at most {MAX_CONSTRAINT_CHARS} characters")
    if not text.strip():
        return None
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:
            bad = text[pos:].lstrip()[:1]
            hint = " (counts, [..] and ! are not supported)" if bad in "*[]!," else ""
            raise ConstraintError(f"--constraint={text!r}: unexpected {bad!r}{hint}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    if sum(t not in "&|()" for t in tokens) > MAX_TERMS:
        raise ConstraintError(f"--constraint={text[:40]}...: at most {MAX_TERMS} feature names")
    expr, rest = _or(tokens, 0, text)
    if rest != len(tokens):
        raise ConstraintError(f"--constraint={text!r}: unexpected {tokens[rest]!r}")
    return expr


def _or(tokens: list[str], i: int, text: str, depth: int = 0) -> tuple[Expr, int]:
    return _joined("|", _and, tokens, i, text, depth)


def _and(tokens: list[str], i: int, text: str, depth: int) -> tuple[Expr, int]:
    return _joined("&", _atom, tokens, i, text, depth)


def _joined(op: str, part, tokens: list[str], i: int, text: str, depth: int) -> tuple[Expr, int]:
    """One or more `part`s joined by `op`."""
    parts = []
    while True:
        one, i = part(tokens, i, text, depth)
        parts.append(one)
        if i < len(tokens) and tokens[i] == op:
            i += 1
            continue
        return (parts[0] if len(parts) == 1 else (op, parts)), i


def _atom(tokens: list[str], i: int, text: str, depth: int) -> tuple[Expr, int]:
    if i >= len(tokens):
        raise ConstraintError(f"--constraint={text!r}: ends where a feature name is expected")
    tok = tokens[i]
    if tok == "(":
        if depth >= 32:
            raise ConstraintError(f"--constraint={text!r}: parentheses nested too deep")
        inner, i = _or(tokens, i + 1, text, depth + 1)
        if i >= len(tokens) or tokens[i] != ")":
            raise ConstraintError(f"--constraint={text!r}: a '(' is not closed")
        return inner, i + 1
    if tok in "&|)":
        raise ConstraintError(f"--constraint={text!r}: {tok!r} where a feature name is expected")
    return tok, i + 1


def select(expr: Expr | None, by_feature: Mapping[str, set], everything: set) -> set:
    """The names with the features `expr` asks for, from `by_feature` (feature -> the names that have
    it), as set operations: a constraint costs its terms, not its terms times the nodes."""
    if expr is None:
        return everything
    if isinstance(expr, str):
        return by_feature.get(expr, set())
    op, parts = expr
    sets = [select(e, by_feature, everything) for e in parts]
    return set.intersection(*sets) if op == "&" else set.union(*sets)


def index(features: Mapping[str, Iterable[str]], names: Iterable[str]) -> dict[str, set]:
    """feature -> those of `names` that have it."""
    out: dict[str, set] = {}
    for n in names:
        for f in features.get(n, ()):
            out.setdefault(f, set()).add(n)
    return out


def features_named(expr: Expr | None) -> set[str]:
    if expr is None:
        return set()
    if isinstance(expr, str):
        return {expr}
    return set().union(*(features_named(e) for e in expr[1]))


@dataclass(frozen=True)
class NodeFilter:
    required: tuple[str, ...] = ()
    excluded: frozenset = frozenset()
    constraint: Expr | None = None
    exclusive: bool = False

    @property
    def restricts(self) -> bool:
        return bool(self.required or self.excluded or self.constraint is not None or self.exclusive)



NO_FILTER = NodeFilter()


def settle(req, part_name: str, part_nodes: Iterable[str], features: Mapping[str, Iterable[str]],
           known: Iterable[str]) -> tuple[int, set]:
    """At submit: the job's node count with its node list counted in (-w of three nodes and no -N is
    three nodes), and the partition's nodes it may run on; or ConstraintError naming what can never be met: a node or feature the cluster does
    not have, a listed node outside the partition or ruled out by -x or -C, too few nodes left."""
    known = set(known)
    part_nodes = list(part_nodes)
    in_part = set(part_nodes)
    for flag, names in (("-w/--nodelist", req.nodelist), ("-x/--exclude", req.exclude)):
        if len(set(names)) != len(names):
            raise ConstraintError(f"{flag} names a node more than once")
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConstraintError(f"{flag}: invalid node name {unknown[0][:64]!r}: no such node in the cluster")
    outside = [n for n in req.nodelist if n not in in_part]
    if outside:
        raise ConstraintError(f"-w/--nodelist: node {outside[0]} is not in partition {part_name}")
    both = set(req.nodelist) & set(req.exclude)
    if both:
        raise ConstraintError(f"node {sorted(both)[0]} is both in -w/--nodelist and in -x/--exclude")
    expr = parse_constraint(req.constraint)
    by_feature = index(features, part_nodes)
    missing = sorted(features_named(expr) - set(by_feature))
    if missing:
        raise ConstraintError(f"--constraint={req.constraint}: invalid feature specification: no node of "
                              f"partition {part_name} has feature {missing[0]!r}")
    count = req.nodes or max(1, len(req.nodelist))
    if count < len(req.nodelist):
        raise ConstraintError(f"-w/--nodelist names {len(req.nodelist)} nodes but --nodes={count}")
    eligible = select(expr, by_feature, in_part) - set(req.exclude)
    ruled_out = [n for n in req.nodelist if n not in eligible]
    if ruled_out:
        raise ConstraintError(f"-w/--nodelist: node {ruled_out[0]} does not have the features "
                              f"--constraint={req.constraint} asks for")
    if len(eligible) < count and (req.exclude or expr is not None):   # (without them: the partition's size)
        raise ConstraintError(f"{count} nodes requested, but only {len(eligible)} nodes of partition "
                              f"{part_name} match -x/--exclude and --constraint")
    return count, eligible
