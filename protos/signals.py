"""Health signals by kind: the few values a metric label or a dashboard groups them by.

A signal is the text a node daemon gives a health event ("XID 79", "NVLink 3 down", "IB mlx5_0/1
DOWN", "thermal", ...); its kind is the first word or two, mapped once here for both daemons.
"""

KINDS = (("xid", "xid"), ("ecc", "ecc"), ("nvlink", "nvlink"), ("ib ", "ib"), ("thermal", "thermal"),
         ("row remap", "row_remap"), ("health program", "health_program"), ("fenced", "fenced"))


def signal_kind(signal: str) -> str:
    """xid, ecc, nvlink, ib, thermal, row_remap, health_program, fenced, or other."""
    s = signal.lower()
    for prefix, kind in KINDS:
        if s.startswith(prefix):
            return kind
    return "other"
