"""Fairshare, pure: the account tree, decayed usage, and Slurm's classic fairshare factor.

The tree has accounts (under "root" or another account) and users as leaves under an account;
each has raw shares. For every association (account, user), with user "" for an account itself:

    S  (NormShares)   = shares / shares of it and its siblings, times the parent's S (root: 1)
    U  (NormUsage)    = its raw usage (its own, or the sum under it) / the raw usage of the whole tree
    UE (EffectvUsage) = U                                        for accounts under root
                      = U + (UE_parent - U) * shares / shares of it and its siblings    deeper down
    F  (FairShare)    = 2 ** (-UE / S)      (0 when S is 0)

Raw usage is billed GPU- and CPU-seconds, charged while jobs run and halved every half-life.
docs/scheduling.md works an example through by hand; tests/test_fairshare.py checks it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from air.airctld.model import DEFAULT_ACCOUNT

ROOT = "root"


@dataclass(frozen=True)
class Assoc:
    """An account (user "") or a user's leaf under an account."""
    account: str
    user: str = ""
    parent: str = ROOT        # for an account; a user's parent is its account
    shares: int = 1
    max_gpus: int = 0         # accounts only: GrpTRES=gres/gpu=N over the account and everything under it

    @property
    def key(self) -> tuple[str, str]:
        return (self.account, self.user)

    @property
    def parent_key(self) -> tuple[str, str] | None:
        if self.user:
            return (self.account, "")
        return None if self.account == ROOT else (self.parent, "")


@dataclass(frozen=True)
class Share:
    account: str
    user: str
    parent: tuple[str, str] | None
    depth: int
    raw_shares: int
    norm_shares: float
    raw_usage: float
    norm_usage: float
    eff_usage: float
    fairshare: float


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    return 0.5 ** (elapsed_s / half_life_s) if elapsed_s > 0 else 1.0


def complete_tree(assocs: Iterable[Assoc], leaves: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Assoc]:
    """The configured associations plus a default leaf (1 share) for every (account, user) that has
    jobs or usage but no association of its own; an unknown account hangs under root."""
    tree = {(ROOT, ""): Assoc(ROOT, parent="")}
    for a in assocs:
        tree[a.key] = a
    for account, user in leaves:
        account = account or DEFAULT_ACCOUNT
        if (account, "") not in tree:
            tree[(account, "")] = Assoc(account)
        if user and (account, user) not in tree:
            tree[(account, user)] = Assoc(account, user)
    return tree


def compute(tree: Mapping[tuple[str, str], Assoc], usage: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], Share]:
    """Every association's shares, usage and fairshare factor. `usage` is raw usage by user leaf."""
    children: dict[tuple[str, str], list[Assoc]] = {}
    for a in tree.values():
        parent = a.parent_key
        if parent is not None and parent in tree:
            children.setdefault(parent, []).append(a)
    raw: dict[tuple[str, str], float] = {}

    def total(key: tuple[str, str]) -> float:
        value = usage.get(key, 0.0) if key[1] else 0.0
        for child in children.get(key, ()):
            value += total(child.key)
        raw[key] = value
        return value

    root_key = (ROOT, "")
    grand = total(root_key)
    out: dict[tuple[str, str], Share] = {}
    out[root_key] = Share(ROOT, "", None, 0, 1, 1.0, grand, 1.0, 1.0, 1.0)
    stack = [root_key]
    while stack:
        key = stack.pop()
        parent = out[key]
        kids = sorted(children.get(key, ()), key=lambda a: a.key)
        sibling_shares = sum(k.shares for k in kids)
        for kid in kids:
            share_ratio = kid.shares / sibling_shares if sibling_shares else 0.0
            s = parent.norm_shares * share_ratio
            u = raw[kid.key] / grand if grand > 0 else 0.0
            ue = u if key == root_key else u + (parent.eff_usage - u) * share_ratio
            f = 2.0 ** (-ue / s) if s > 0 else 0.0
            out[kid.key] = Share(kid.account, kid.user, key, parent.depth + 1, kid.shares, s, raw[kid.key],
                                 u, ue, f)
            stack.append(kid.key)
    return out


def ancestors(tree: Mapping[tuple[str, str], Assoc], account: str) -> list[str]:
    """The account and the accounts above it, nearest first, root excluded."""
    out = []
    key = (account, "")
    while key in tree and key[0] != ROOT:
        out.append(key[0])
        key = tree[key].parent_key or (ROOT, "")
    return out


def accrue(usage: Mapping[tuple[str, str], float], jobs, since: float, until: float, half_life_s: float,
           billing_gpu: float, billing_cpu: float) -> dict[tuple[str, str], float]:
    """Usage at `until`: what it was at `since`, decayed over the interval, plus each job's billed
    GPU- and CPU-seconds within the interval (jobs given as (leaf, start, end or 0, gpus, cpus))."""
    factor = decay_factor(until - since, half_life_s)
    out = {k: v * factor for k, v in usage.items()}
    for leaf, start, end, gpus, cpus in jobs:
        lo = start if start > since else since
        hi = end if (end and end < until) else until
        if hi > lo:
            out[leaf] = out.get(leaf, 0.0) + (hi - lo) * (gpus * billing_gpu + cpus * billing_cpu)
    return out
