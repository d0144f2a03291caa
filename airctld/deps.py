"""Job dependencies (--dependency), pure: parse the spec, and judge it against other jobs' states.

    afterok:ID[:ID...]     after each ID completed successfully
    afternotok:ID[:ID...]  after each ID ended in failure (non-zero exit, cancel, timeout, node fail, ...)
    afterany:ID[:ID...]    after each ID ended, however
    after:ID[:ID...]       after each ID started (or ended)
    singleton              after every other job of the same name and user has ended

Terms joined with "," must all hold; joined with "?", any one. An ID that names an array
job stands for all of its tasks. A dependency that can no longer hold (afterok on a job that
failed) is NEVER, so the job shows DependencyNeverSatisfied instead of waiting forever.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable

from air.protos.states import JobPhase, JobResult

KINDS = ("after", "afterok", "afternotok", "afterany", "singleton")


class DepState(enum.Enum):
    SATISFIED = "satisfied"
    WAITING = "waiting"
    NEVER = "never"


@dataclass(frozen=True)
class Term:
    kind: str
    job_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Dependency:
    terms: tuple[Term, ...]
    any_of: bool = False

    @property
    def job_ids(self) -> set[int]:
        return {i for t in self.terms for i in t.job_ids}

    @property
    def singleton(self) -> bool:
        return any(t.kind == "singleton" for t in self.terms)


def parse(text: str) -> Dependency | None:
    """The dependency in `text` ("" gives None); ValueError says what is wrong and what is valid."""
    text = text.strip()
    if not text:
        return None
    if "," in text and "?" in text:
        raise ValueError(f"dependency {text!r} mixes ',' (all) and '?' (any); use one of them")
    any_of = "?" in text
    terms = []
    for part in text.split("?" if any_of else ","):
        kind, _, ids = part.partition(":")
        if kind not in KINDS:
            raise ValueError(f"dependency {part!r}: the type must be one of {', '.join(KINDS)}")
        if kind == "singleton":
            if ids:
                raise ValueError("dependency singleton takes no job ids")
            terms.append(Term(kind))
            continue
        numbers = []
        for token in ids.split(":"):
            token = token.split("+")[0]   # Slurm's after:ID+minutes: the delay is not supported
            # (what int() reads, as admission took it: a pending job's text is read again at each pass)
            try:
                number = int(token) if token.isdecimal() else 0
            except ValueError:   # (past int()'s 4,300 digits)
                number = 0
            if not 1 <= number < 2**63:   # (the store's integers)
                raise ValueError(f"dependency {part!r}: give job ids, such as {kind}:123 or {kind}:123:124")
            numbers.append(number)
        terms.append(Term(kind, tuple(numbers)))
    return Dependency(tuple(terms), any_of)


def _term_state(term: Term, states: Callable[[int], Iterable[tuple[JobPhase, JobResult]]]) -> DepState:
    out = DepState.SATISFIED
    for job_id in term.job_ids:
        for phase, result in states(job_id):
            done = phase == JobPhase.DONE
            if term.kind == "after":
                ok, never = phase != JobPhase.PENDING, False
            elif term.kind == "afterany":
                ok, never = done, False
            elif term.kind == "afterok":
                ok, never = done and result == JobResult.COMPLETED, done and result != JobResult.COMPLETED
            else:  # afternotok
                ok, never = done and result != JobResult.COMPLETED, done and result == JobResult.COMPLETED
            if never:
                return DepState.NEVER
            if not ok:
                out = DepState.WAITING
    return out


def evaluate(dep: Dependency, states: Callable[[int], Iterable[tuple[JobPhase, JobResult]]],
             singleton_free: bool) -> DepState:
    """`states(id)` gives the (phase, result) of the job, or of every task of the array with that id;
    `singleton_free` says whether no other job of the same name and user is in the way."""
    results = []
    for term in dep.terms:
        if term.kind == "singleton":
            results.append(DepState.SATISFIED if singleton_free else DepState.WAITING)
        else:
            results.append(_term_state(term, states))
    if dep.any_of:
        if DepState.SATISFIED in results:
            return DepState.SATISFIED
        return DepState.NEVER if all(r == DepState.NEVER for r in results) else DepState.WAITING
    if DepState.NEVER in results:
        return DepState.NEVER
    return DepState.WAITING if DepState.WAITING in results else DepState.SATISFIED
