"""The account tree and fairshare usage, kept in the store: who may charge what, how much each
association has used (decayed), and the shares view that airshare prints.

Usage is charged from jobs' start and end times for each interval, so it is exact across
restarts: the store keeps the usage and the time it was charged up to, and a restarted
controller charges from there.
"""
from __future__ import annotations

import logging
from typing import Iterable

from air.airctld import fairshare
from air.protos.config import Config
from air.airctld.errors import Conflict, InvalidRequest, NotFound
from air.airctld.fairshare import ROOT, Assoc, Share
from air.airctld.model import Job
from air.airctld.priority import association
from air.airctld.store import Store
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase

log = logging.getLogger("airctld")

CHARGE_INTERVAL_S = 5.0


class Accounting:
    def __init__(self, config: Config, store: Store, now: float, jobs: Iterable[Job]):
        self.config = config
        self.sched = config.scheduler
        self.store = store
        stored = {a.key: a for a in store.load_assocs()}
        seeded = [Assoc(a.name, "", a.parent, a.shares, a.max_gpus) for a in config.accounts
                  if (a.name, "") not in stored]
        if seeded:
            with store.transaction():
                for a in seeded:
                    store.save_assoc(a)
                    stored[a.key] = a
        # replaced whole on each change, never changed in place: readers outside the controller's lock
        # (a pass's priorities, airshare) iterate the dict they took
        self.assocs: dict[tuple[str, str], Assoc] = stored
        self._chains: tuple[dict, dict, dict] | None = None   # (the assocs they were made from, chains, quotas)
        usage, charged = store.load_usage()
        self.usage = usage
        self.charged_until = charged or now
        # what ended after the last charge, which the controller that saw it end did not charge: jobs
        # (not all in memory, after a stop longer than the visibility window), and runs that ended in a
        # requeue (their job forgot their times)
        jobs = list(jobs)
        by_id = {j.job_id: j for j in jobs}
        jobs += [j for j in store.jobs_ended_after(self.charged_until) if j.job_id not in by_id]
        runs = store.runs_ended_after(self.charged_until)
        by_id.update(store.get_jobs([job_id for job_id, *_ in runs if job_id not in by_id]))
        requeued = [(association(by_id[job_id]), start, end, gpus, cpus)
                    for job_id, start, end, gpus, cpus in runs if job_id in by_id]
        self.charge(jobs, now, force=True, requeued=requeued)

    # ------------------------------------------------------------ usage

    def due(self, now: float) -> bool:
        """Whether charge() would charge now (unforced)."""
        return not now - self.charged_until < CHARGE_INTERVAL_S

    def charge(self, jobs: Iterable[Job], now: float, force: bool = False, requeued: Iterable[tuple] = ()) -> bool:
        """Charge usage up to `now` (at most every CHARGE_INTERVAL_S unless forced) and save it: the runs
        of `jobs` (active or ended) and `requeued`, runs that ended in a requeue since the last charge (a
        requeued job no longer has its run's times), each as ended_run() gave it."""
        if not force and not self.due(now):
            return False
        since, before = self.charged_until, self.usage
        running = [(association(j), j.start_time, j.end_time if j.phase == JobPhase.DONE else 0.0,
                    j.gpus_held, j.cpus_held)
                   for j in jobs if j.start_time and (j.phase != JobPhase.DONE or j.end_time > since)]
        running += requeued
        s = self.sched
        usage = fairshare.accrue(before, running, since, now, s.usage_half_life_s, s.billing_gpu, s.billing_cpu)
        with self.store.transaction():
            self.store.save_usage(usage, now)
        # a new dict, never one changed in place: passes and airshare read it without a lock
        self.usage, self.charged_until = usage, now
        return True

    @staticmethod
    def ended_run(job: Job, end: float) -> tuple:
        """What charge() needs of a run of `job` (as it was while active) that ended at `end`."""
        return (association(job), job.start_time, end, job.gpus_held, job.cpus_held)

    # ------------------------------------------------------------ the tree

    def tree(self, leaves: Iterable[tuple[str, str]] = (), usage=None) -> dict[tuple[str, str], Assoc]:
        usage = self.usage if usage is None else usage
        return fairshare.complete_tree(self.assocs.values(), list(usage) + list(leaves))

    def shares(self, leaves: Iterable[tuple[str, str]] = ()) -> dict[tuple[str, str], Share]:
        usage = self.usage   # one reading: the tree and the shares from the same usage
        return fairshare.compute(self.tree(leaves, usage), usage)

    def account_chains(self) -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
        """account -> (it and the accounts above it), and account -> its GPU quota. They depend on the
        configured tree alone (an account known only from usage hangs under root, with no quota), so
        they are worked out once per change of the tree, not on every submit and pass."""
        assocs, cached = self.assocs, self._chains
        if cached is None or cached[0] is not assocs:
            tree = fairshare.complete_tree(assocs.values(), ())
            chains = {k[0]: tuple(fairshare.ancestors(tree, k[0])) for k in tree if not k[1] and k[0] != ROOT}
            quotas = {k[0]: a.max_gpus for k, a in tree.items() if not k[1] and a.max_gpus}
            cached = self._chains = (assocs, chains, quotas)
        return cached[1], cached[2]

    def has_accounts(self) -> bool:
        return bool(self.assocs)

    def user_accounts(self, user: str) -> list[str]:
        return sorted(a for a, u in self.assocs if u == user)

    def exists(self, account: str) -> bool:
        return (account, "") in self.assocs

    def rows(self, jobs: Iterable[Job], active: Iterable[Job], accounts=(), users=()) -> list[pb.ShareRow]:
        """airshare: the tree in order, each association with its shares, usage and factor."""
        leaves = [association(j) for j in jobs]
        usage = self.usage
        tree = self.tree(leaves, usage)
        shares = fairshare.compute(tree, usage)
        in_use: dict[tuple[str, str], int] = {}
        for j in active:
            leaf = association(j)
            gpus = j.gpus_held
            in_use[leaf] = in_use.get(leaf, 0) + gpus
            for a in fairshare.ancestors(tree, leaf[0]):
                in_use[(a, "")] = in_use.get((a, ""), 0) + gpus
        children: dict = {}
        for key, s in shares.items():
            if s.parent is not None:
                children.setdefault(s.parent, []).append(key)
        out = []

        def walk(key):
            s = shares[key]
            shown = (not accounts or s.account in accounts) and (not users or s.user in users or not s.user)
            if shown and key != (ROOT, ""):
                out.append(pb.ShareRow(account=s.account, user=s.user, depth=s.depth - 1, raw_shares=s.raw_shares,
                                       norm_shares=s.norm_shares, raw_usage=s.raw_usage, norm_usage=s.norm_usage,
                                       eff_usage=s.eff_usage, fairshare=s.fairshare,
                                       max_gpus=tree[key].max_gpus, gpus_in_use=in_use.get(key, 0)))
            # users before sub-accounts, as sshare lists them
            for child in sorted(children.get(key, ()), key=lambda k: (k[1] == "", k)):
                walk(child)

        walk((ROOT, ""))
        return out

    # ------------------------------------------------------------ aircontrol account

    def add(self, a: Assoc) -> None:
        if a.key in self.assocs:
            what = f"user {a.user} in account {a.account}" if a.user else f"account {a.account}"
            raise Conflict(f"{what} already exists; use aircontrol account modify")
        if a.user:
            if (a.account, "") not in self.assocs:
                raise NotFound(f"account {a.account} does not exist; add it first")
            a = Assoc(a.account, a.user, a.account, a.shares, 0)
        else:
            if a.account in (ROOT, "default") or not a.account:
                raise InvalidRequest(f"account name {a.account!r} is reserved")
            if a.parent != ROOT and (a.parent, "") not in self.assocs:
                raise NotFound(f"parent account {a.parent} does not exist")
        self._save(a)

    def modify(self, a: Assoc, fields: Iterable[str]) -> None:
        old = self.assocs.get(a.key)
        if old is None:
            raise NotFound(f"{'user ' + a.user + ' in ' if a.user else ''}account {a.account} does not exist")
        fields = set(fields)
        unknown = fields - {"parent", "shares", "max_gpus"}
        if unknown:
            raise InvalidRequest(f"cannot modify {sorted(unknown)[0]}; fields: parent, shares, max_gpus")
        new = Assoc(old.account, old.user, a.parent if "parent" in fields else old.parent,
                    a.shares if "shares" in fields else old.shares,
                    a.max_gpus if "max_gpus" in fields else old.max_gpus)
        if "parent" in fields and not old.user:
            if new.parent != ROOT and (new.parent, "") not in self.assocs:
                raise NotFound(f"parent account {new.parent} does not exist")
            up = new.parent
            while up != ROOT:
                if up == new.account:
                    raise InvalidRequest(f"account {new.account} cannot be under itself")
                up = self.assocs[(up, "")].parent
        self._save(new)

    def remove(self, account: str, user: str) -> None:
        if (account, user) not in self.assocs:
            raise NotFound(f"{'user ' + user + ' in ' if user else ''}account {account} does not exist")
        if not user:
            below = [k for k, a in self.assocs.items() if k != (account, "") and
                     (a.parent == account or (a.user and a.account == account))]
            if below:
                k = below[0]
                what = f"user {k[1]}" if k[1] else f"account {k[0]}"
                raise Conflict(f"account {account} still has {what} under it; remove that first")
        with self.store.transaction():
            self.store.remove_assoc(account, user)
        self.assocs = {k: v for k, v in self.assocs.items() if k != (account, user)}

    def _save(self, a: Assoc) -> None:
        with self.store.transaction():
            self.store.save_assoc(a)
        self.assocs = {**self.assocs, a.key: a}
