"""Who may do what: operators, job ownership, private job lists, account membership.

Names and groups come from the controller host's user database (pwd/grp, so LDAP/SSSD too),
looked up once per uid; the identity itself comes only from the verified credential.
"""
from __future__ import annotations

import grp
import os
import pwd
from functools import lru_cache

from air.protos.config import Config
from air.airctld.errors import Denied, InvalidRequest
from air.protos.credential import Identity


@lru_cache(maxsize=4096)
def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@lru_cache(maxsize=4096)
def group_names(uid: int, gid: int) -> frozenset[str]:
    """The names of the groups a user is in (primary and supplementary)."""
    gids = {gid}
    try:
        gids.update(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except KeyError:
        pass
    names = set()
    for g in gids:
        try:
            names.add(grp.getgrgid(g).gr_name)
        except KeyError:
            names.add(str(g))
    return frozenset(names)


def _member(who: Identity, entries) -> bool:
    """Whether the user is named in entries (user names, or @group)."""
    name = user_name(who.uid)
    groups = None
    for entry in entries:
        if entry.startswith("@"):
            groups = groups if groups is not None else group_names(who.uid, who.gid)
            if entry[1:] in groups:
                return True
        elif entry == name:
            return True
    return False


class Policy:
    def __init__(self, config: Config):
        self.config = config

    def is_operator(self, who: Identity) -> bool:
        return who.is_root or _member(who, self.config.controller.operators)

    def check_may_act(self, who: Identity, job, doing: str) -> None:
        if job.uid != who.uid and not self.is_operator(who):
            raise Denied(f"job {job.job_id} belongs to {job.user} (uid {job.uid}); you may {doing} only "
                         "your own jobs")

    def check_qos(self, who: Identity, qos, account: str) -> None:
        """Whether the user may submit in the QOS, charging `account`: operators always; others where
        the QOS is open to all, names them (or a group of theirs), or names the account (one they
        belong to: the caller checked it). A QOS that preempts others, but the default QOS, is never
        open to all: it must say who may use it."""
        default = qos.name == self.config.scheduler.default_qos
        if qos.open_to_all(default) or self.is_operator(who) or _member(who, qos.users) or account in qos.accounts:
            return
        raise Denied(f"user {user_name(who.uid)} may not use QOS {qos.name}"
                     + (f" with account {account}" if qos.accounts else "") + "; ask an administrator")

    def sees_all(self, who: Identity) -> bool:
        return not self.config.controller.private_jobs or self.is_operator(who)

    def account_for(self, who: Identity, requested: str, tree=None) -> str:
        """The account a job is charged to. Members come from the configuration ([[accounts]] users,
        @groups too) and from the account tree (aircontrol account add ACCOUNT --user). With no
        accounts at all, whatever was asked."""
        accounts = self.config.accounts
        names = [a.name for a in accounts]
        mine = [a.name for a in accounts if _member(who, a.users)]
        if tree is not None:
            names += [a for a, u in tree.assocs if not u and a not in names]
            mine += [a for a in tree.user_accounts(user_name(who.uid)) if a not in mine]
        if not names:
            return requested
        if not requested:
            if not mine:
                raise Denied(f"user {user_name(who.uid)} belongs to no account; ask an administrator to add "
                             "them to one")
            return mine[0]
        if requested not in names:
            raise InvalidRequest(f"account {requested!r} does not exist; accounts: " + ", ".join(names))
        if requested not in mine and not who.is_root:
            raise Denied(f"user {user_name(who.uid)} may not charge account {requested}; their accounts: "
                         + (", ".join(mine) or "none"))
        return requested
