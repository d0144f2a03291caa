"""The airbatch option table: one table for the command line, #AIR/#SBATCH lines and the environment.

Precedence, lowest first: defaults < script directives < environment < command line.
Everything here is pure: it parses text and returns values or raises OptionError.
"""
from __future__ import annotations

import re
import shlex

from air.protos.limits import MAX_CONSTRAINT_CHARS, MAX_HET_COMPONENTS, MAX_NODE_NAMES, is_number
from air.protos.record import Record
from air.protos.timefmt import parse_duration


class OptionError(Exception):
    pass


class Opt(Record):
    dest: str
    long: str
    short: str | None = None
    kind: str = "str"          # str, count (positive int), int, time, gpus, gres, flag, array, switches, signal,
    #                            begin, size (MB), hostlist, constraint, exclusive
    env: tuple[str, ...] = ()
    help: str = ""


OPTIONS: tuple[Opt, ...] = (
    Opt("name", "--job-name", "-J", env=("AIRBATCH_JOB_NAME", "SBATCH_JOB_NAME"), help="job name"),
    Opt("nodes", "--nodes", "-N", "count", help="number of nodes"),
    Opt("gpus_per_node", "--gpus-per-node", None, "gpus", env=("AIRBATCH_GPUS_PER_NODE", "SBATCH_GPUS_PER_NODE"),
        help="GPUs on each node ([type:]N)"),
    Opt("gpus_per_node", "--gres", None, "gres", help="generic resources, gpu[:type]:N"),
    Opt("ntasks_per_node", "--ntasks-per-node", None, "count", help="tasks on each node"),
    Opt("cpus_per_task", "--cpus-per-task", "-c", "count", help="CPUs for each task"),
    Opt("time", "--time", "-t", "time", env=("AIRBATCH_TIMELIMIT", "SBATCH_TIMELIMIT"),
        help="time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S"),
    Opt("partition", "--partition", "-p", env=("AIRBATCH_PARTITION", "SBATCH_PARTITION"), help="partition"),
    Opt("account", "--account", "-A", env=("AIRBATCH_ACCOUNT", "SBATCH_ACCOUNT"), help="account to charge"),
    Opt("output", "--output", "-o", help="stdout file pattern (%j %x %u %N)"),
    Opt("error", "--error", "-e", help="stderr file pattern"),
    Opt("chdir", "--chdir", "-D", help="working directory of the script"),
    Opt("export", "--export", None, env=("AIRBATCH_EXPORT", "SBATCH_EXPORT"),
        help="ALL, NONE, or VAR[=value],... to pass to the job"),
    Opt("hold", "--hold", "-H", "flag", help="submit held"),
    Opt("dependency", "--dependency", "-d", help="afterok:ID[:ID...], afternotok:, afterany:, after:, singleton; "
        "',' for all, '?' for any"),
    Opt("qos", "--qos", "-q", env=("AIRBATCH_QOS", "SBATCH_QOS"), help="quality of service"),
    Opt("nice", "--nice", None, "int", help="lower the priority by N (negative: raise it; operators only)"),
    Opt("array", "--array", "-a", "array", env=("AIRBATCH_ARRAY_INX", "SBATCH_ARRAY_INX"),
        help="job array indices: 0-99, 1,5,9, 0-99:4, with %N to run at most N at once"),
    Opt("switches", "--switches", None, "switches", help="N[@TIME]: at most N leaf switches, waiting up to TIME"),
    Opt("signal", "--signal", None, "signal", help="[B:]SIG[@SECONDS]: send SIG this long before the time limit"),
    Opt("mem", "--mem", None, "size", help="memory per node (N[K|M|G|T], default M); enforced by the job's cgroup"),
    Opt("mem_per_gpu", "--mem-per-gpu", None, "size", help="memory per allocated GPU (N[K|M|G|T], default M)"),
    Opt("hang_timeout", "--hang-timeout", None, "time", help="end the job as HUNG (requeued if allowed) when its "
        "ranks report no progress for this long"),
    Opt("begin", "--begin", "-b", "begin", help="start no earlier than: now+N[s|m|h|d], HH:MM[:SS] or "
        "YYYY-MM-DDTHH:MM[:SS]"),
    Opt("requeue", "--requeue", None, "flag", help="may be requeued (the default)"),
    Opt("no_requeue", "--no-requeue", None, "flag", help="never requeue: a node failure ends the job"),
    Opt("retries", "--retries", None, "count", help="requeue after a failure of its own, up to N times"),
    Opt("ntasks", "--ntasks", "-n", "count", env=("SBATCH_NTASKS",),
        help="tasks in all, as many on each node (on one node unless --nodes)"),
    Opt("gpus_per_task", "--gpus-per-task", None, "gpus", help="GPUs for each task ([type:]N)"),
    Opt("gpus", "--gpus", "-G", "gpus", env=("SBATCH_GPUS",), help="GPUs in all ([type:]N), as many on each node"),
    Opt("comment", "--comment", None, help="a comment kept with the job (airacct -o Comment)"),
    Opt("wckey", "--wckey", None, env=("SBATCH_WCKEY",), help="a workload key kept with the job (airacct -o WCKey)"),
    Opt("mail_type", "--mail-type", None, help="recorded with the job; AIR sends no mail"),
    Opt("mail_user", "--mail-user", None, help="recorded with the job; AIR sends no mail"),
    Opt("open_mode", "--open-mode", None, "open_mode", env=("SBATCH_OPEN_MODE",),
        help="append (the default: each run adds to the output) or truncate (each run starts it empty)"),
    Opt("wait", "--wait", "-W", "flag", help="return once the job has ended, with its exit code"),
    Opt("exclusive", "--exclusive", None, "exclusive", help="whole nodes: every GPU and CPU, shared with no other job"),
    Opt("constraint", "--constraint", "-C", "constraint", help="node features: a100, a100&ib, a100|h100, (a|b)&c"),
    Opt("nodelist", "--nodelist", "-w", "hostlist", help="these nodes are in the job (a host list: node[01-04])"),
    Opt("exclude", "--exclude", "-x", "hostlist", help="none of these nodes is in the job (a host list)"),
)
FLAG_KINDS = ("flag", "exclusive")
BY_NAME = {o.long: o for o in OPTIONS} | {o.short: o for o in OPTIONS if o.short}

# sbatch(1)'s other options (Slurm 24.05): each is refused with one line naming it as Slurm's, never
# taken for a typo and never ignored. (long, short, takes a value)
SLURM_ONLY: tuple[tuple[str, str | None, bool], ...] = (
    ("--acctg-freq", None, True), ("--batch", None, True), ("--bb", None, True), ("--bbf", None, True),
    ("--cluster-constraint", None, True), ("--clusters", "-M", True), ("--container", None, True),
    ("--container-id", None, True), ("--contiguous", None, False), ("--core-spec", "-S", True),
    ("--cores-per-socket", None, True), ("--cpu-freq", None, True), ("--cpus-per-gpu", None, True),
    ("--deadline", None, True), ("--delay-boot", None, True), ("--distribution", "-m", True),
    ("--export-file", None, True), ("--extra", None, True), ("--extra-node-info", "-B", True),
    ("--get-user-env", None, False), ("--gid", None, True), ("--gpu-bind", None, True),
    ("--gpu-freq", None, True), ("--gpus-per-socket", None, True), ("--gres-flags", None, True),
    ("--hint", None, True), ("--ignore-pbs", None, False), ("--input", "-i", True),
    ("--kill-on-invalid-dep", None, True), ("--licenses", "-L", True), ("--mcs-label", None, True),
    ("--mem-bind", None, True), ("--mem-per-cpu", None, True), ("--mincpus", None, True),
    ("--network", None, True), ("--no-kill", "-k", False), ("--nodefile", "-F", True),
    ("--ntasks-per-core", None, True), ("--ntasks-per-gpu", None, True), ("--ntasks-per-socket", None, True),
    ("--overcommit", "-O", False), ("--oversubscribe", "-s", False), ("--power", None, True),
    ("--prefer", None, True), ("--priority", None, True), ("--profile", None, True), ("--propagate", None, False),
    ("--quiet", "-Q", False), ("--reboot", None, False), ("--reservation", None, True),
    ("--resv-ports", None, False), ("--segment", None, True), ("--sockets-per-node", None, True),
    ("--spread-job", None, False), ("--stepmgr", None, False), ("--thread-spec", None, True),
    ("--threads-per-core", None, True), ("--time-min", None, True), ("--tmp", None, True),
    ("--tres-bind", None, True), ("--tres-per-task", None, True), ("--uid", None, True), ("--usage", None, False),
    ("--use-min-nodes", None, False), ("--verbose", "-v", False), ("--version", "-V", False),
    ("--wait-all-nodes", None, True),
)
SLURM_ONLY_NAMES = {long: long for long, _, _ in SLURM_ONLY} | {short: long for long, short, _ in SLURM_ONLY if short}


def not_supported(name: str) -> str:
    """What a Slurm option AIR does not take is told."""
    return f"{SLURM_ONLY_NAMES.get(name, name)} is an sbatch option AIR does not support (see docs/slurm.md)"
DIRECTIVE = re.compile(r"^#(AIR|SBATCH)(\s|$)")


# the largest number each kind takes (what its wire field holds: counts are uint32, a nice int32)
_MAXIMA = {"count": 2**31 - 1, "int": 2**31 - 1, "gpus": 2**31 - 1, "gres": 2**31 - 1, "switches": 2**31 - 1,
           "time": 2**32, "size": 2**40}


def convert(opt: Opt, value: str | None) -> object:
    """The option's value from its text, or OptionError naming the option and the value."""
    out = _convert(opt, value)
    most = _MAXIMA.get(opt.kind)
    if most is not None and any(abs(n) > most for n in (out if isinstance(out, tuple) else (out,))):
        bound = {"int": f"from {-most:,} to {most:,}", "time": f"at most {most // 60:,} minutes",
                 "size": f"at most {most:,} MB",
                 "switches": f"at most {most:,} switches, waiting at most {most // 60:,} minutes"
                 }.get(opt.kind, f"at most {most:,}")
        raise OptionError(f"{opt.long}={value!r}: out of range ({bound})")
    return out


def _convert(opt: Opt, value: str | None) -> object:
    if opt.kind == "exclusive":   # (Slurm's --exclusive=user|mcs|topo share nodes in ways AIR does not)
        if value is not None:
            raise OptionError(f"{opt.long}={value}: AIR supports only --exclusive (whole nodes)")
        return True
    if opt.kind == "flag":
        if value is not None:
            raise OptionError(f"{opt.long} takes no value (got {value!r})")
        return True
    if value is None or value == "":
        raise OptionError(f"{opt.long} needs a value")
    if opt.kind == "hostlist":
        return parse_hostlist(opt.long, value)
    if opt.kind == "constraint":
        if len(value) > MAX_CONSTRAINT_CHARS or not value.isprintable():   # (as airctld/validate.py)
            raise OptionError(f"{opt.long}: at most {MAX_CONSTRAINT_CHARS} printable characters")
        return value
    if opt.kind == "count":
        if not is_number(value) or int(value) < 1:
            raise OptionError(f"{opt.long}={value!r}: give a whole number of at least 1")
        return int(value)
    if opt.kind == "int":
        try:
            return int(value)
        except ValueError:
            raise OptionError(f"{opt.long}={value!r}: give a whole number") from None
    if opt.kind == "array":
        from air.protos import arrays
        try:
            arrays.parse(value)
        except ValueError as e:
            raise OptionError(str(e)) from None
        return value
    if opt.kind == "switches":
        count, at, wait = value.partition("@")
        if not is_number(count) or int(count) < 1:
            raise OptionError(f"{opt.long}={value!r}: give N[@TIME], such as 1 or 1@10:00")
        try:
            return int(count), parse_duration(wait) if at else 0
        except ValueError as e:
            raise OptionError(f"{opt.long}: {e}") from None
    if opt.kind == "signal":
        return parse_signal(value)
    if opt.kind == "begin":
        return parse_begin(value)
    if opt.kind == "size":
        m = re.fullmatch(r"(\d+)([KMGT]?)B?", value.strip().upper())
        if not m or int(m.group(1)) == 0:
            raise OptionError(f"{opt.long}={value!r}: give a size such as 4096, 512M or 16G")
        scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2)]
        return max(1, int(int(m.group(1)) * scale))
    if opt.kind == "time":
        try:
            return parse_duration(value)
        except ValueError as e:
            raise OptionError(f"{opt.long}: {e}") from None
    if opt.kind == "open_mode":
        if value not in ("append", "truncate"):
            raise OptionError(f"{opt.long}={value!r}: give append or truncate")
        return value
    if opt.kind in ("gpus", "gres"):
        text = value
        if opt.kind == "gres":
            if not value.startswith("gpu"):
                raise OptionError(f"{opt.long}={value!r}: only gpu[:type]:N is supported")
            text = value[3:].lstrip(":") or "1"
        count = text.rsplit(":", 1)[-1]
        if not is_number(count):
            raise OptionError(f"{opt.long}={value!r}: give a GPU count, such as 4 or h100:4")
        return int(count)
    return value


def parse_hostlist(flag: str, text: str) -> list[str]:
    """A host list (node[01-04],gpu7) expanded; a file name (Slurm reads one when the value has a
    '/') is refused."""
    import hostlist
    if "/" in text:
        raise OptionError(f"{flag}={text}: AIR takes a host list here, not a file")
    if len(text) > 65536:
        raise OptionError(f"{flag}: at most 65536 characters")
    try:
        names = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as e:
        raise OptionError(f"{flag}={text}: not a host list ({e})") from None
    if len(names) > MAX_NODE_NAMES:
        raise OptionError(f"{flag}: {len(names)} nodes; at most {MAX_NODE_NAMES}")
    return list(dict.fromkeys(names))   # a node named twice is named once (as Slurm)


def resolve_tasks(values: dict[str, object]) -> dict[str, object]:
    """--ntasks, --gpus-per-task and --gpus in AIR's terms (nodes, tasks and GPUs on each node): AIR
    puts the same number of tasks and GPUs on every node of a job, so totals must divide evenly.
    -w without -N asks for as many nodes as it lists (as sbatch)."""
    out = dict(values)
    if out.get("nodelist") and "nodes" not in out:
        out["nodes"] = len(out["nodelist"])
    nodes = out.get("nodes", 1)
    if "ntasks" in out:
        ntasks = out.pop("ntasks")
        if "nodes" not in out:   # as many nodes as --ntasks-per-node makes of them; else one
            per = values.get("ntasks_per_node", ntasks)
            if ntasks % per:
                raise OptionError(f"--ntasks={ntasks} is not a multiple of --ntasks-per-node={per}")
            nodes = out["nodes"] = ntasks // per
        if ntasks % nodes:
            raise OptionError(f"--ntasks={ntasks} over {nodes} nodes: AIR runs the same number of tasks on "
                              "each node; give a multiple of --nodes")
        per_node = ntasks // nodes
        if out.get("ntasks_per_node", per_node) != per_node:
            raise OptionError(f"--ntasks={ntasks} and --ntasks-per-node={out['ntasks_per_node']} over {nodes} "
                              "nodes disagree")
        out["ntasks_per_node"] = per_node
    if "gpus_per_task" in out:
        gpus = out.pop("gpus_per_task") * out.get("ntasks_per_node", 1)
        if out.get("gpus_per_node", gpus) != gpus:
            raise OptionError(f"--gpus-per-task gives {gpus} GPUs on each node, --gpus-per-node "
                              f"{out['gpus_per_node']}")
        out["gpus_per_node"] = gpus
    if "gpus" in out:
        total = out.pop("gpus")
        if total % nodes:
            raise OptionError(f"--gpus={total} over {nodes} nodes: AIR gives each node of a job the same number "
                              "of GPUs; give a multiple of --nodes")
        if out.get("gpus_per_node", total // nodes) != total // nodes:
            raise OptionError(f"--gpus={total} over {nodes} nodes and --gpus-per-node={out['gpus_per_node']} "
                              "disagree")
        out["gpus_per_node"] = total // nodes
    return out


def parse_begin(value: str, now: float | None = None) -> float:
    """--begin: now+N[s|m|h|d] (seconds by default), HH:MM[:SS] (today, or tomorrow once past), or
    YYYY-MM-DDTHH:MM[:SS], in local time. Returns seconds since the epoch."""
    import time as clock
    now = clock.time() if now is None else now
    text = value.strip()
    if text.startswith("now"):
        rest = text[3:]
        if not rest:
            return now
        m = re.fullmatch(r"\+(\d+)([smhd]?)", rest)
        if m:
            return now + int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    for form in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            return clock.mktime(clock.strptime(text, form))
        except ValueError:
            pass
    for form in ("%H:%M:%S", "%H:%M"):
        try:
            t = clock.strptime(text, form)
        except ValueError:
            continue
        today = clock.localtime(now)
        when = clock.mktime((today.tm_year, today.tm_mon, today.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, 0, 0, -1))
        return when if when > now else when + 86400
    raise OptionError(f"--begin={value!r}: give now+N[s|m|h|d], HH:MM[:SS] or YYYY-MM-DDTHH:MM[:SS]")


def parse_signal(value: str) -> tuple[int, int, bool]:
    """--signal=[B:]SIG[@SECONDS] -> (signal number, seconds before the limit (default 60), batch only)."""
    import signal as signals
    batch = value.startswith("B:")
    text = value[2:] if batch else value
    name, at, secs = text.partition("@")
    if is_number(name):
        number = int(name)
    else:
        upper = name.upper()
        try:
            number = int(signals.Signals[upper if upper.startswith("SIG") else "SIG" + upper])
        except KeyError:
            raise OptionError(f"--signal={value!r}: unknown signal {name!r}; give [B:]SIG[@SECONDS], "
                              "such as USR2@120 or B:TERM@60") from None
    if at and (not is_number(secs) or int(secs) > 65535):
        raise OptionError(f"--signal={value!r}: the time after @ is whole seconds up to 65535")
    if not 0 < number < 65:
        raise OptionError(f"--signal={value!r}: no signal {number}")
    return number, int(secs) if at else 60, batch


def parse_tokens(tokens: list[str]) -> dict[str, object]:
    """Parse option tokens (`--opt=v`, `--opt v`, `-X v`, `-Xv`, flags) into {dest: value}."""
    values: dict[str, object] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            name, eq, inline = tok.partition("=")
            value = inline if eq else None
        elif tok.startswith("-") and len(tok) >= 2:
            name, value = tok[:2], (tok[2:] or None)
        else:
            raise OptionError(f"unexpected argument {tok!r}; directives hold options only")
        opt = BY_NAME.get(name)
        if opt is None:
            raise OptionError(not_supported(name) if name in SLURM_ONLY_NAMES else f"unknown option {name}")
        if value is None and opt.kind not in FLAG_KINDS:
            if i + 1 >= len(tokens):
                raise OptionError(f"{opt.long} needs a value")
            i += 1
            value = tokens[i]
        values[opt.dest] = convert(opt, value)
        i += 1
    return values


HET_SEPARATORS = ("hetjob", "packjob")   # a line of its own between the components of a heterogeneous job


def parse_directives(script: str) -> dict[str, object]:
    """Options from the #AIR and #SBATCH lines at the top of a script, before its first command. With
    `#SBATCH hetjob` lines (a heterogeneous job), the first component's options, and under "het" the
    options of every component in order."""
    values: dict[str, object] = {}
    components = [values]
    for number, line in enumerate(script.splitlines(), start=1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if not stripped or (stripped.startswith("#") and not DIRECTIVE.match(stripped)):
            continue
        if not DIRECTIVE.match(stripped):
            break  # the first command: directives after it are ignored, as sbatch does
        body = DIRECTIVE.sub("", stripped, count=1)
        try:
            tokens = shlex.split(body, comments=True)
            if tokens in ([word] for word in HET_SEPARATORS):
                if len(components) >= MAX_HET_COMPONENTS:
                    raise OptionError(f"more than {MAX_HET_COMPONENTS} components")
                values = {}
                components.append(values)
                continue
            values.update(parse_tokens(tokens))
        except (OptionError, ValueError) as e:
            raise OptionError(f"line {number}: {e}: {stripped}") from None
    if len(components) > 1:
        return {**components[0], "het": components}
    return values


# Options a heterogeneous job has once, for all its components: a later component may repeat the
# first's value, not change it (AIR runs the components as one job)
HET_SHARED = ("partition", "account", "qos", "time", "dependency", "array", "begin", "output", "error",
              "chdir", "export", "hold", "nice", "requeue", "no_requeue", "retries", "signal", "open_mode",
              "comment", "wckey", "mail_type", "mail_user", "hang_timeout", "wait", "switches", "exclusive")
# Per-node needs: the job gets the largest component's on every node
HET_LARGEST = ("gpus_per_node", "ntasks_per_node", "cpus_per_task", "mem", "mem_per_gpu")


def merge_het(components: list[dict[str, object]]) -> tuple[dict[str, object], list[tuple[str, int]]]:
    """A heterogeneous job's components (each as parse_directives gives it, already merged with the
    command line's options for the first) as AIR runs them: one job on the components' nodes in all,
    with the largest component's needs on every node; and each component's (name, nodes)."""
    if any(c.get("nodelist") for c in components):
        raise OptionError("-w is not supported for a heterogeneous job in AIR (its components' nodes are "
                          "chosen together)")
    resolved = [resolve_tasks(c) for c in components]
    if any("mem" in c for c in resolved) and any("mem_per_gpu" in c for c in resolved):
        raise OptionError("--mem in one component and --mem-per-gpu in another: AIR gives every node of a "
                          "heterogeneous job one memory limit; give the same kind in each")
    merged = dict(resolved[0])
    sizes = []
    for index, comp in enumerate(resolved):
        if index and (comp.get("exclude") or comp.get("constraint")):
            raise OptionError(f"component {index}: -x and -C apply to a heterogeneous job as a whole in "
                              "AIR: give them in the first component")
        for key in HET_SHARED:
            if index and key in comp and comp[key] != resolved[0].get(key):
                raise OptionError(f"component {index}: --{key.replace('_', '-')} differs from the first "
                                  "component's; AIR runs a heterogeneous job as one job, with one value")
        for key in HET_LARGEST:
            if key in comp:
                merged[key] = max(merged.get(key, 0), comp[key])
        sizes.append((str(comp.get("name") or ""), int(comp.get("nodes", 1))))
    merged["nodes"] = sum(n for _, n in sizes)
    return merged, sizes


def from_environment(env: dict[str, str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for opt in OPTIONS:
        for var in opt.env:
            if env.get(var):
                try:
                    values[opt.dest] = convert(opt, env[var])
                except OptionError as e:
                    raise OptionError(f"${var}: {e}") from None
                break
    return values


def export_environment(spec: str, env: dict[str, str]) -> dict[str, str]:
    """The environment a job gets for --export: ALL (default), NONE, or [ALL,]VAR[=value],... Without
    ALL, the SLURM_* variables are kept, as sbatch's and srun's manuals say."""
    parts = [p for p in (spec or "ALL").split(",") if p]
    out: dict[str, str] = {}
    if parts and parts[0] == "ALL":
        out.update(env)
        parts = parts[1:]
    else:
        out.update((k, v) for k, v in env.items() if k.startswith("SLURM_"))
    if parts and parts[0] == "NONE":
        parts = parts[1:]
    elif parts and "=" not in parts[0] and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", parts[0]):
        raise OptionError(f"--export={spec!r}: give ALL, NONE, or VAR[=value],...")
    for part in parts:
        name, eq, value = part.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise OptionError(f"--export: {name!r} is not a variable name")
        if eq:
            out[name] = value
        elif name in env:
            out[name] = env[name]
    for name, value in out.items():   # (a request carries text: name a variable it cannot, not its value)
        try:
            name.encode()
            value.encode()
        except UnicodeEncodeError:
            raise OptionError(f"environment variable {name.encode(errors='replace').decode()!r} is not UTF-8 "
                              f"text, which a job cannot be given: unset it, or name what to pass with --export"
                              ) from None
    return out
