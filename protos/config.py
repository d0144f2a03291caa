"""The cluster configuration (air.toml), shared by airctld, airnoded and the tools.

Loaded once into frozen records (protos.record) and checked on load: an unknown key or a bad value
raises ConfigError with a message that names the key and the file.
"""
from __future__ import annotations

import ipaddress
import math
import os
import re
import tomllib
from typing import TYPE_CHECKING

import hostlist

from air.protos import hostport, rlimits
from air.protos.limits import is_number
from air.protos.record import Record, fields, replace
from air.protos.timefmt import parse_duration

if TYPE_CHECKING:   # (pathlib is imported where a path is made: the short commands never need one)
    from pathlib import Path

DEFAULT_PATH = "/etc/air/air.toml"
AUTH_MODES = ("none", "munge")
FEATURE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NODE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class ConfigError(Exception):
    pass


class ControllerConfig(Record):
    address: str = "127.0.0.1:6817"
    state_dir: str = "/var/lib/air"
    auth: str = "munge"
    munge_socket: str = ""     # "": libmunge's default (/run/munge/munge.socket.2)
    service_user: str = "root"  # the user airctld runs as; node daemons accept calls from it
    operators: tuple = ()      # users, or @groups, who may act on any job
    private_jobs: bool = False  # airq shows others' jobs only to root and operators
    heartbeat_interval_s: float = 2.0
    node_timeout_s: float = 15.0
    fence_timeout_s: float = 0.0   # a node daemon that has not heard from airctld this long stops its jobs
    #                                (0: half of node_timeout_s); airctld restarts them elsewhere only later
    kill_wait_s: float = 30.0
    propagate_rlimits: tuple = ("ALL",)          # the submitter's resource limits a job gets (Slurm's
    #                                              PropagateResourceLimits): ALL, NONE, or names (NOFILE, ...)
    propagate_rlimits_except: tuple = ("MEMLOCK",)   # ... but these (RDMA needs the node's MEMLOCK)
    unkillable_timeout_s: float = 60.0   # a run whose processes outlive SIGKILL this long is given up and its
    #                                      node drained ("Kill task failed"; Slurm's UnkillableStepTimeout); 0: never
    inactive_limit_s: float = 60.0   # airrun's own allocation ends when airrun has not renewed it this long
    #                                  (killed, frozen or cut off; Slurm's InactiveLimit); 0: never
    min_job_age_s: float = 300.0
    max_script_bytes: int = 4 * 1024 * 1024
    max_env_bytes: int = 1024 * 1024
    drop_env: tuple = ()       # variables never passed from the submit host to a job
    max_message_bytes: int = 8 * 1024 * 1024
    # bounds on what one request may ask of the daemons (a refusal names the key)
    max_tasks_per_node: int = 512        # ranks of one step on one node
    max_array_tasks: int = 10_000        # tasks of one --array
    max_dependencies: int = 1_000        # job ids in one --dependency
    max_name_chars: int = 256            # job, account, QOS, partition names
    max_report_bytes: int = 64 * 1024    # one progress report of a rank
    max_steps_per_user: int = 16         # airrun streams one user may hold open on one node
    max_pids_per_job: int = 32_768       # tasks (processes and threads) of one run on one node (pids cgroup); 0: none
    max_steps_per_job: int = 40_000      # steps one job may start, all its runs together (Slurm's MaxStepCount)
    history_page_jobs: int = 2_000       # jobs in one reply of job history (airacct asks for the next page)
    cluster_name: str = "air"            # jobs see it as SLURM_CLUSTER_NAME
    events_keep_days: float = 30.0       # job and node health events kept this long (who cancelled a job: with it)
    jobs_keep_days: float = 365.0        # ended jobs kept this long, with their runs, steps and reports
    report_sample_s: float = 60.0        # an ended job's progress reports thinned to one per this
    metrics_address: str = ""            # host:port to serve Prometheus /metrics on; "": none
    metrics_user_labels: bool = True     # per-user series (users are unbounded: a large site may turn them off)

    @property
    def fence_after_s(self) -> float:
        return self.fence_timeout_s or self.node_timeout_s / 2

    @property
    def fence_grace_s(self) -> float:
        """SIGTERM at the fence, SIGKILL this much later: half-way to the controller's node timeout."""
        return (self.node_timeout_s - self.fence_after_s) / 2

    @property
    def fenced_by_s(self) -> float:
        """How long after a node was last heard from it has surely fenced itself: the fence, its
        SIGKILL, and a heartbeat of margin."""
        return self.fence_after_s + self.fence_grace_s + self.heartbeat_interval_s

    @property
    def host(self) -> str:
        return hostport.split(self.address)[0]

    def service_uid(self) -> int:
        import pwd
        try:
            return pwd.getpwnam(self.service_user).pw_uid
        except KeyError:
            raise ConfigError(f"[controller] service_user = {self.service_user!r}: no such user on this host") from None

    def authenticator(self):
        from air.protos.credential import from_settings
        return from_settings(self.auth, self.munge_socket)


class NodeConfig(Record):
    name: str
    address: str
    port: int = 6818
    gpus: str = "nvml"        # "nvml", "sim:N", or "none"
    cpus: int = 0             # 0: what the host has
    memory_mb: int = 0        # 0: what the host has
    spool_dir: str = "/var/spool/air/%n"
    switch: str = ""          # the InfiniBand leaf switch the node hangs from ("": its own)
    block: str = ""           # the NVLink domain (a multi-node NVLink rack), if any
    ib_sysfs: str = "/sys/class/infiniband"   # %n: the node's name (tests point this at a fake tree)
    health_program: str = ""  # run every health_interval_s; a non-zero exit drains the node
    health_interval_s: float = 5.0
    health_timeout_s: float = 30.0
    max_gpu_temp_c: int = 0   # a GPU above this drains the node (0: no limit)
    metrics_port: int = 0     # serve Prometheus /metrics on the node's address at this port; 0: none
    health_auto_resume: bool = False   # a node drained by a condition that clears (IB port, heat, the
    #                                    health program) returns by itself once it has; never one an admin drained
    features: tuple = ()      # names a job may ask for with --constraint (-C), as Slurm's Features=

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def spool(self) -> Path:
        from pathlib import Path
        return Path(self.spool_dir.replace("%n", self.name))

    @property
    def ib_root(self) -> Path:
        from pathlib import Path
        return Path(self.ib_sysfs.replace("%n", self.name))


class PartitionConfig(Record):
    name: str
    nodes: tuple[str, ...]
    default: bool = False
    up: bool = True
    max_time_s: int = 0       # 0: unlimited
    default_time_s: int = 0   # 0: max_time_s
    priority: int = 0         # the partition factor: this over the highest partition priority
    accounts: tuple = ()      # accounts that may use the partition; empty: all


class AccountConfig(Record):
    name: str
    users: tuple = ()         # user names, or @groups, who may charge jobs to this account
    parent: str = "root"
    shares: int = 1
    max_gpus: int = 0         # GrpTRES=gres/gpu: GPUs the account and its sub-accounts hold at once; 0: no limit


class QosConfig(Record):
    name: str
    priority: int = 0         # the QOS factor: this over the highest QOS priority
    max_gpus_per_user: int = 0     # 0: no limit
    max_gpus_per_account: int = 0
    max_time_s: int = 0
    preempt: tuple = ()       # QOS names whose running jobs this one may preempt
    users: tuple = ()         # who may use it (user names, @group), besides operators
    accounts: tuple = ()      # jobs of these accounts may use it
    # open to everyone when neither list is set, but a QOS that preempts others (not the default
    # QOS): operators only

    def open_to_all(self, default: bool = False) -> bool:
        """Open to every user: it names no one, and preempts nothing (or is the default QOS, which
        every job without --qos is in)."""
        return not self.users and not self.accounts and (not self.preempt or default)


class SchedulerConfig(Record):
    """Multifactor priority, fairshare, backfill and preemption."""
    weight_age: int = 1000
    weight_fairshare: int = 10000
    weight_jobsize: int = 1000
    weight_partition: int = 1000
    weight_qos: int = 2000
    max_age_s: int = 7 * 86400        # the age factor reaches 1 after this long pending
    usage_half_life_s: int = 7 * 86400
    billing_gpu: float = 1.0          # usage charged per GPU-second
    billing_cpu: float = 0.0          # and per CPU-second
    reservations: int = 1000          # how many blocked jobs get a backfill reservation, per node group
    max_pass_s: float = 0.5           # a pass stops looking at further jobs after this long (bf_max_time)
    preempt_grace_s: float = 30.0     # a preempted job's time to checkpoint before SIGKILL
    default_qos: str = "normal"


class Config(Record):
    controller: ControllerConfig
    nodes: tuple[NodeConfig, ...]
    partitions: tuple[PartitionConfig, ...]
    accounts: tuple[AccountConfig, ...] = ()
    qos: tuple[QosConfig, ...] = (QosConfig("normal"),)
    scheduler: SchedulerConfig = SchedulerConfig()
    path: str = ""

    def qos_named(self, name: str) -> QosConfig | None:
        return next((q for q in self.qos if q.name == name), None)

    def node(self, name: str) -> NodeConfig | None:
        return next((n for n in self.nodes if n.name == name), None)

    def partition(self, name: str) -> PartitionConfig | None:
        if not name:
            return next((p for p in self.partitions if p.default), None)
        return next((p for p in self.partitions if p.name == name), None)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def config_path(explicit: str | None = None) -> str:
    """--config, else $AIR_CONF, else /etc/air/air.toml."""
    return explicit or os.environ.get("AIR_CONF") or DEFAULT_PATH


def load(explicit: str | None = None) -> Config:
    path = config_path(explicit)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist (set --config or AIR_CONF)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    try:
        return replace(parse(data), path=path)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def parse(data: dict) -> Config:
    _check_keys("the top level", data, {"controller", "nodes", "partitions", "accounts", "qos", "scheduler"})
    controller = _build(ControllerConfig, "[controller]", data.get("controller", {}))
    if controller.auth not in AUTH_MODES:
        raise ConfigError(f"[controller] auth = {controller.auth!r}: valid values are {', '.join(AUTH_MODES)}")
    try:
        hostport.split(controller.address)   # (the text airctld binds, and the tools call)
    except ValueError:
        raise ConfigError(f"[controller] address = {controller.address!r}: give host:port") from None
    for key in ("heartbeat_interval_s", "node_timeout_s", "max_tasks_per_node", "max_array_tasks",
                "max_dependencies", "max_name_chars", "max_report_bytes", "max_steps_per_user",
                "max_steps_per_job", "history_page_jobs"):
        if getattr(controller, key) <= 0:
            raise ConfigError(f"[controller] {key} = {getattr(controller, key)!r}: must be above 0")
    for key in ("events_keep_days", "jobs_keep_days", "report_sample_s"):
        if not getattr(controller, key) > 0:   # (nan too)
            raise ConfigError(f"[controller] {key} = {getattr(controller, key)!r}: must be above 0")
    if not 1 <= controller.report_sample_s < float("inf"):
        raise ConfigError(f"[controller] report_sample_s = {controller.report_sample_s!r}: at least 1 s")
    if controller.jobs_keep_days * 86400 < controller.min_job_age_s:
        raise ConfigError(f"[controller] jobs_keep_days = {controller.jobs_keep_days:g}: at least min_job_age_s "
                          f"({controller.min_job_age_s:g} s), for which ended jobs stay in memory")
    if controller.metrics_address:
        try:
            hostport.split(controller.metrics_address, bare_ipv6=True)   # (as airctld binds it)
        except ValueError:
            raise ConfigError(f"[controller] metrics_address = {controller.metrics_address!r}: give host:port")
    if not 0 <= controller.inactive_limit_s < float("inf") or 0 < controller.inactive_limit_s < 3:
        raise ConfigError(f"[controller] inactive_limit_s = {controller.inactive_limit_s!r}: 0 (never), or at "
                          "least 3 s, over which airrun renews its allocation")
    for key in ("propagate_rlimits", "propagate_rlimits_except"):
        try:
            rlimits.check([n for n in getattr(controller, key) if n not in ("ALL", "NONE")], f"[controller] {key}")
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if not (controller.unkillable_timeout_s == 0 or 2 <= controller.unkillable_timeout_s < float("inf")):
        raise ConfigError(f"[controller] unkillable_timeout_s = {controller.unkillable_timeout_s!r}: 0 (never), or "
                          "at least 2: the seconds after SIGKILL at which a run that will not die is given up")
    if controller.node_timeout_s <= controller.heartbeat_interval_s:
        raise ConfigError("[controller] node_timeout_s must be longer than heartbeat_interval_s")
    if controller.fence_timeout_s < 0 or controller.fence_after_s + controller.heartbeat_interval_s \
            >= controller.node_timeout_s:
        raise ConfigError(f"[controller] fence_timeout_s = {controller.fence_after_s:g}: a node must fence itself "
                          "at least one heartbeat_interval_s before node_timeout_s, when airctld gives its jobs "
                          "to other nodes")
    if controller.fence_after_s < 3 * controller.heartbeat_interval_s:
        raise ConfigError(f"[controller] fence_timeout_s = {controller.fence_after_s:g} (0: half of node_timeout_s): "
                          f"at least 3 heartbeats ({3 * controller.heartbeat_interval_s:g} s), or a single lost "
                          "heartbeat would stop every job on a node; raise node_timeout_s or fence_timeout_s")
    nodes = []
    for i, raw in enumerate(data.get("nodes", [])):
        nodes.extend(_nodes(f"[[nodes]] #{i + 1}", raw))
    names = [n.name for n in nodes]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"node {sorted(dup)[0]} is configured twice")
    partitions = [_partition(f"[[partitions]] #{i + 1}", raw, set(names))
                  for i, raw in enumerate(data.get("partitions", []))]
    if sum(p.default for p in partitions) > 1:
        raise ConfigError("more than one partition has default = true")
    accounts = []
    for i, raw in enumerate(data.get("accounts", [])):
        where = f"[[accounts]] #{i + 1}"
        if not isinstance(raw, dict) or "name" not in raw:
            raise ConfigError(f"{where} needs a name")
        accounts.append(_build(AccountConfig, where, raw))
    _check_tree(accounts)
    qos = [_qos(f"[[qos]] #{i + 1}", raw) for i, raw in enumerate(data.get("qos", []))]
    sched = _scheduler(data.get("scheduler", {}))
    if not any(q.name == sched.default_qos for q in qos):
        if data.get("qos"):
            raise ConfigError(f"[scheduler] default_qos = {sched.default_qos!r}: no [[qos]] has that name")
        qos.append(QosConfig(sched.default_qos))
    names = {q.name for q in qos}
    for q in qos:
        unknown = [p for p in q.preempt if p not in names]
        if unknown:
            raise ConfigError(f"[[qos]] {q.name} preempt names {unknown[0]!r}, which no [[qos]] defines")
    _check_preempt_cycles(qos)
    account_names = {a.name for a in accounts}
    for q in qos:   # (a QOS for accounts that do not exist would be open to whoever names one)
        unknown = [a for a in q.accounts if a not in account_names]
        if unknown:
            raise ConfigError(f"[[qos]] {q.name} accounts names {unknown[0]!r}, which no [[accounts]] defines")
    for p in partitions:
        unknown = [a for a in p.accounts if a not in account_names]
        if unknown:
            raise ConfigError(f"partition {p.name} accounts names {unknown[0]!r}, which no [[accounts]] defines")
    return Config(controller=controller, nodes=tuple(nodes), partitions=tuple(partitions),
                  accounts=tuple(accounts), qos=tuple(qos), scheduler=sched)


def _check_preempt_cycles(qos: list[QosConfig]) -> None:
    """A QOS may not preempt itself, nor QOS that (through others) preempt it: victims would
    preempt their preemptors back. A depth-first search that visits each QOS once (three colours:
    unseen, on the path, done), so a long ladder checks in linear time."""
    edges = {q.name: q.preempt for q in qos}
    done: set[str] = set()
    for q in qos:
        if q.name in done:
            continue
        path, on_path = [q.name], {q.name: 0}
        stack = [iter(edges.get(q.name, ()))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                name = path.pop()
                del on_path[name]
                done.add(name)
                continue
            if nxt in on_path:
                loop = path[on_path[nxt]:] + [nxt]
                what = "preempts itself" if len(loop) == 2 else f"is in a preemption cycle: {' -> '.join(loop)}"
                raise ConfigError(f"[[qos]] {nxt} {what}; a QOS may only preempt QOS that cannot "
                                  "preempt it back")
            if nxt not in done and nxt in edges:
                on_path[nxt] = len(path)
                path.append(nxt)
                stack.append(iter(edges[nxt]))


def _check_tree(accounts: list[AccountConfig]) -> None:
    names = [a.name for a in accounts]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"account {sorted(dup)[0]} is configured twice")
    parents = {a.name: a.parent for a in accounts}
    for a in accounts:
        if a.name == "root":
            raise ConfigError("[[accounts]] root is the tree's top and is not configured")
        if a.parent != "root" and a.parent not in parents:
            raise ConfigError(f"account {a.name} has parent {a.parent!r}, which no [[accounts]] defines")
        seen, up = {a.name}, a.parent
        while up != "root":
            if up in seen:
                raise ConfigError(f"account {a.name}: its parents form a loop")
            seen.add(up)
            up = parents[up]


def _durations(where: str, raw: dict, keys: tuple[str, ...]) -> dict:
    """Keys given as Slurm times ("7-0", "30", "1:00:00") or seconds, renamed to key_s."""
    out = {}
    for key in keys:
        if key in raw:
            value = raw[key]
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_NUMBER["int"]:
                out[key + "_s"] = int(value)
                continue
            try:
                out[key + "_s"] = parse_duration(str(value)[:64])
            except ValueError as e:
                raise ConfigError(f"{where} {key}: {e}") from None
            if out[key + "_s"] > MAX_NUMBER["int"]:
                raise ConfigError(f"{where} {key} = {_short(value)}: at most {MAX_NUMBER['int']} s")
    return out


def _qos(where: str, raw: dict) -> QosConfig:
    _check_keys(where, raw, {"name", "priority", "max_gpus_per_user", "max_gpus_per_account", "max_time", "preempt",
                             "users", "accounts"})
    if "name" not in raw:
        raise ConfigError(f"{where} needs a name")
    rest = {k: v for k, v in raw.items() if k != "max_time"}
    return _build(QosConfig, where, {**rest, **_durations(where, raw, ("max_time",))})


def _scheduler(raw: dict) -> SchedulerConfig:
    where = "[scheduler]"
    times = ("max_age", "usage_half_life")
    plain = set(fields(SchedulerConfig)) - {t + "_s" for t in times}
    _check_keys(where, raw, plain | set(times))
    rest = {k: v for k, v in raw.items() if k not in times}
    sched = _build(SchedulerConfig, where, {**rest, **_durations(where, raw, times)})
    if sched.usage_half_life_s <= 0:
        raise ConfigError(f"{where} usage_half_life must be above 0")
    if sched.max_age_s <= 0:
        raise ConfigError(f"{where} max_age must be above 0")
    return sched


def _check_keys(where: str, raw: dict, allowed: set[str]) -> None:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {where}; known keys: {', '.join(sorted(allowed))}")


MAX_NUMBER = {"int": 2**31 - 1, "float": 1e9}   # bytes, counts and seconds; 1e9 s is 31 years


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:20]}..."


def _build(cls, where: str, raw: dict, **extra):
    types = fields(cls)
    _check_keys(where, raw, set(types) - set(extra))
    values = {}
    for key, value in raw.items():
        want = types[key]
        ok = {"str": isinstance(value, str), "int": isinstance(value, int) and not isinstance(value, bool),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool),
              "bool": isinstance(value, bool),
              "tuple": isinstance(value, list) and all(isinstance(v, str) for v in value)}.get(want, True)
        if not ok:
            kind = "list of strings" if want == "tuple" else want
            raise ConfigError(f"{where} {key} = {value!r}: expected a {kind}")
        if want == "float" and isinstance(value, float) and not math.isfinite(value):   # (nan passes every comparison)
            raise ConfigError(f"{where} {key} = {value!r}: must be a finite number")
        if want in ("int", "float") and value > MAX_NUMBER[want]:   # (a timer, or a gRPC limit, over it fails)
            raise ConfigError(f"{where} {key} = {_short(value)}: at most {MAX_NUMBER[want]:g}")
        if want in ("int", "float") and value < 0:
            raise ConfigError(f"{where} {key} = {value!r}: must not be negative")
        values[key] = tuple(value) if want == "tuple" else value
    return cls(**values, **extra)


def _expand(where: str, key: str, text: str) -> list[str]:
    try:
        return hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as e:
        raise ConfigError(f"{where} {key} = {text!r}: not a host list ({e})") from None


def _nodes(where: str, raw: dict) -> list[NodeConfig]:
    _check_keys(where, raw, set(fields(NodeConfig)))
    if "name" not in raw or "address" not in raw:
        raise ConfigError(f"{where} needs name and address")
    names = _expand(where, "name", raw["name"])
    addresses = _expand(where, "address", raw["address"])
    if len(addresses) != len(names):
        raise ConfigError(f"{where}: {len(names)} names but {len(addresses)} addresses")
    gpus = raw.get("gpus", "nvml")
    if not (gpus in ("nvml", "none") or (gpus.startswith("sim:") and is_number(gpus[4:]))):
        raise ConfigError(f"{where} gpus = {gpus!r}: valid values are \"nvml\", \"none\" or \"sim:N\"")
    out = []
    for name, address in zip(names, addresses):
        if not NODE_NAME.fullmatch(name) or name in (".", ".."):   # (a folder's name in the spool and cgroups)
            raise ConfigError(f"{where} name {name!r} is not a node name (letters, digits, _ . -; at most 64)")
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ConfigError(f"{where} address {address!r} is not an IP address") from None
        node = _build(NodeConfig, where, {**raw, "name": name, "address": address})
        if node.metrics_port > 65535:
            raise ConfigError(f"{where} metrics_port = {node.metrics_port}: not a port number")
        bad = next((f for f in node.features if not FEATURE.fullmatch(f)), None)
        if bad is not None:
            raise ConfigError(f"{where} features: {bad!r} is not a feature name (letters, digits, _ . -)")
        out.append(node)
    return out


def _partition(where: str, raw: dict, known: set[str]) -> PartitionConfig:
    _check_keys(where, raw, {"name", "nodes", "default", "state", "max_time", "default_time", "priority",
                             "accounts"})
    if "name" not in raw or "nodes" not in raw:
        raise ConfigError(f"{where} needs name and nodes")
    nodes = _expand(where, "nodes", raw["nodes"])
    missing = [n for n in nodes if n not in known]
    if missing:
        raise ConfigError(f"{where} ({raw['name']}) names node {missing[0]}, which no [[nodes]] entry defines")
    state = raw.get("state", "up")
    if state not in ("up", "down"):
        raise ConfigError(f"{where} state = {state!r}: valid values are \"up\", \"down\"")
    times = {}
    for key in ("max_time", "default_time"):
        try:
            times[key] = parse_duration(str(raw.get(key, "UNLIMITED"))[:64])
        except ValueError as e:
            raise ConfigError(f"{where} {key}: {e}") from None
        if times[key] > MAX_NUMBER["int"]:
            raise ConfigError(f"{where} {key} = {_short(raw[key])}: at most {MAX_NUMBER['int']} s")
    if not isinstance(raw.get("default", False), bool):
        raise ConfigError(f"{where} default = {raw['default']!r}: expected true or false")
    extra = _build(PartitionConfig, where, {k: raw[k] for k in ("priority", "accounts") if k in raw},
                   name=raw["name"], nodes=tuple(nodes))
    return replace(extra, default=raw.get("default", False), up=state == "up",
                               max_time_s=times["max_time"],
                               default_time_s=times["default_time"] or times["max_time"])
