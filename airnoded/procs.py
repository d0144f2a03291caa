"""Small process helpers shared by batch scripts (launcher) and step ranks (steps)."""
from __future__ import annotations

import os
import pwd


def as_owner(uid: int, gid: int) -> tuple[dict, dict]:
    """(Popen keyword arguments, environment additions) to run as uid:gid with the user's groups;
    nothing to change when that is the daemon's own user."""
    if uid == os.getuid():
        return {}, {}
    try:
        entry = pwd.getpwuid(uid)
        groups = os.getgrouplist(entry.pw_name, gid)
        env = {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name}
    except KeyError:
        groups, env = [gid], {}
    return dict(user=uid, group=gid, extra_groups=groups), env


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group that may already be gone (never 0 or 1: the caller's own group, or init's)."""
    if pgid <= 1:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass

