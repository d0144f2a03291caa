"""Health signals: the text a health event carries ("XID 79", "NVLink 3 down", "IB mlx5_0/1 DOWN",
"thermal", ...) is made here and read back here, into one kind, for both daemons.

The node daemon names a signal through these functions and constants; the controller decides by its
kind (which conditions clear by themselves) and metrics group by the kind's label. The text stays
what people read in `aircontrol show node` and the node's health history.
"""
import enum

from air.protos.limits import is_number


class HealthKind(enum.Enum):
    """A signal's kind; the value is its metric label (the IB kinds share one)."""
    XID = "xid"
    ECC = "ecc"
    NVLINK = "nvlink"
    ROW_REMAP = "row_remap"
    IB_PORT = "ib"          # a port not ACTIVE (DOWN, INIT, POLLING, ...)
    IB_ERRORS = "ib_errors"
    IB_FLAPPING = "ib_flapping"
    THERMAL = "thermal"
    HEALTH_PROGRAM = "health_program"
    FENCED = "fenced"
    KILL_TASK_FAILED = "kill_task_failed"   # a run's processes outlived SIGKILL (Slurm's "Kill task failed")
    ADMIN = "admin"
    RESUMED = "resumed"
    OTHER = "other"

    @property
    def label(self) -> str:
        """The metric label: the IB kinds together, as "ib"."""
        return "ib" if self.name.startswith("IB_") else self.value

    @property
    def clears_by_itself(self) -> bool:
        """A condition that can pass (a port, a temperature, the admin's program): a node drained by it
        may return to service once it has, where the node's configuration allows."""
        return self in (HealthKind.IB_PORT, HealthKind.THERMAL, HealthKind.HEALTH_PROGRAM)

    @property
    def ends_jobs(self) -> bool:
        """A critical event of this kind ends the jobs on the failing GPU (on every GPU, for a node-wide
        one); a run that will not die drains its node, and the other jobs there run on, as in Slurm."""
        return self != HealthKind.KILL_TASK_FAILED


ECC_DBE = "ECC DBE"
ROW_REMAP_FAILURE = "row remap failure"
THERMAL = "thermal"
HEALTH_PROGRAM = "health program"
FENCED = "fenced"
KILL_TASK_FAILED = "Kill task failed"   # Slurm's reason, which sites' scripts look for
ADMIN = "admin"
RESUMED = "resumed"
_FIXED = {ECC_DBE: HealthKind.ECC, ROW_REMAP_FAILURE: HealthKind.ROW_REMAP, THERMAL: HealthKind.THERMAL,
          HEALTH_PROGRAM: HealthKind.HEALTH_PROGRAM, FENCED: HealthKind.FENCED,
          KILL_TASK_FAILED: HealthKind.KILL_TASK_FAILED, ADMIN: HealthKind.ADMIN,
          RESUMED: HealthKind.RESUMED}


def xid(code: int) -> str:
    return f"XID {code}"


def nvlink_down(link: int) -> str:
    return f"NVLink {link} down"


def ib_port(port: str, state: str) -> str:
    """A port not ACTIVE, in the state sysfs gives ("1: DOWN" or "DOWN")."""
    return f"IB {_word(port)} {_word(state.split(': ')[-1]) or 'unknown'}"


def ib_errors(port: str) -> str:
    return f"IB {_word(port)} errors"


def ib_flapping(port: str) -> str:
    return f"IB {_word(port)} flapping"


def _word(text: str) -> str:
    """One word of a signal: a name read from sysfs never splits it (its spaces become "_")."""
    return "".join(("_" if c.isspace() else c) for c in text.strip() if c.isprintable() or c.isspace())


def kind_of(signal: str) -> HealthKind:
    """The kind of a signal made above (also one stored by an earlier version, or sent by an older
    node daemon: the texts have not changed)."""
    fixed = _FIXED.get(signal)
    if fixed is not None:
        return fixed
    words = signal.split(" ")
    if len(words) == 2 and words[0] == "XID" and is_number(words[1]):
        return HealthKind.XID
    if len(words) == 3 and words[0] == "NVLink" and words[2] == "down":
        return HealthKind.NVLINK
    if len(words) >= 3 and words[0] == "IB" and words[1]:   # (an earlier daemon's port state had spaces)
        kinds = {"errors": HealthKind.IB_ERRORS, "flapping": HealthKind.IB_FLAPPING}
        return kinds.get(words[2], HealthKind.IB_PORT) if len(words) == 3 else HealthKind.IB_PORT
    return HealthKind.OTHER
