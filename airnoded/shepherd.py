"""The shepherd: a small root process that starts a run's processes on this node (its batch script,
or the ranks of one step here) as their parent, waits for them and writes down how each ended.

It is what lets a node daemon restart (a package upgrade, `systemctl restart airnoded`, a crash)
without killing jobs: a process's exit status goes only to its parent, so the parent must be a
process that outlives the daemon. The daemon starts one shepherd per batch script and per step
on the node, each in a session of its own, and the unit file's KillMode=process leaves them
alone when the daemon stops. A new daemon finds them through their record and adopts the runs.

    python -I -S shepherd.py               (the spec: one line of JSON on standard input)
    python -I -S shepherd.py --serve SOCK  (a spawner that forks shepherds: see serve())

Standard library only, so that it starts in a few milliseconds with -I -S (isolated, no site).

The spec: {"folder": path, "tag": name, "events": fd, "holds": [path, ...], "cgroup": path or "",
"uid": int or null, "gid": int, "groups": [int, ...], "children": [{"argv": [...], "env": {...},
"stdout": fd, "stderr": fd, "start": null or {"cwd": path, "out": path, "err": path or "",
"truncate": bool}}, ...]}. fds are the shepherd's (passed by the daemon).

Before it starts anything, the shepherd puts FOLDER/TAG.record in place (root's, in the run's
root-owned folder: written aside and renamed) with one line, "shepherd PID START BOOT":
itself, and the kernel's boot id (pids and start times are those of one boot), so a daemon that
dies at any point finds it; and, when its children join a cgroup, a second, "cgroup PATH" (the
first of "cgroups": the run's group, fence.recorded_cgroup). Each event is one more line, appended
to the record and then written to the events FIFO (or pipe) the daemon reads:
    pid I PID START     child I runs, as process PID (leader of its own session and process
                        group), START its start time in clock ticks after boot
    exit I STATUS       child I ended; STATUS is waitpid's raw status
The daemon learns that the shepherd has ended from end of file on the events FIFO (the
shepherd holds its only write end). Output FIFOs listed in "holds" are held open read-write, so
that a child writing its output never gets EPIPE while no daemon reads: it waits instead.

Each child, before it runs anything of the job's owner: its own session, the run's cgroup (the
child joins it itself, as root, so nothing it forks escapes; it never runs if it cannot), the
owner's groups, gid and uid; with "start", as the owner, its working directory and its output files
(open_outputs); default signal dispositions, standard input from /dev/null.

shepherd.c is the same shepherd as a C program (the daemon's choice where it was built); the two
keep one behaviour, and the tests run both.
"""
import json
import os
import resource
import signal
import sys

IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGQUIT, signal.SIGUSR1,
           signal.SIGUSR2)
RESET = IGNORED + (signal.SIGXFSZ,)
NO_CGROUP = 125    # the child's exit code when it cannot join the run's cgroup
CANNOT_RUN = 126


def boot_id():
    """This boot's id (the kernel's random boot_id); "" if the kernel does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().strip().decode("ascii", "replace")
    except OSError:
        return ""


def start_time(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


class Events:
    def __init__(self, record, fd):
        self.record = record   # (open for appending: record_own)
        self.fd = fd

    def say(self, line):
        data = (line + "\n").encode()
        try:   # the record first: a daemon that reads the FIFO and dies leaves it to the next one
            os.write(self.record, data)
        except OSError:
            pass
        try:
            os.write(self.fd, data)
        except OSError:   # no daemon reads now: the record has it
            pass


def child(spec, one, null):
    """In the forked child: never returns."""
    try:
        os.setsid()
        for group in joined_groups(spec):
            try:   # (the run's memory group, and on cgroup v1 its pids group beside it)
                with open(os.path.join(group, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            except OSError as e:
                os.write(one["stderr"], ("cannot enter the job's cgroup: %s\n" % e.strerror).encode())
                os._exit(NO_CGROUP)
        set_limits(spec.get("rlimits") or ())
        os.dup2(null, 0)
        os.dup2(one["stdout"], 1)
        os.dup2(one["stderr"], 2)
        os.closerange(3, 1 << 16)
        if spec.get("uid") is not None:
            os.setgroups(spec["groups"])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        if one.get("start"):
            open_outputs(one["start"])
        for sig in RESET:
            signal.signal(sig, signal.SIG_DFL)
        argv = one["argv"]
        os.execve(argv[0], argv, one["env"])
    except BaseException as e:   # noqa: B036 - the child must end here whatever happened
        try:
            os.write(2, ("cannot run %s: %s\n" % (one["argv"][0] if one.get("argv") else "?",
                                                   getattr(e, "strerror", None) or e)).encode())
        except Exception:
            pass
    os._exit(CANNOT_RUN)


def open_outputs(start):
    """As the job's owner: its working directory, then its output files (made, truncated or appended
    to, with the owner's rights only); failures go to the start-up status pipe (fds 1 and 2 yet)."""
    try:
        os.chdir(start["cwd"])
    except OSError as e:
        os.write(2, ("cannot enter the working directory %s: %s\n" % (start["cwd"], e.strerror)).encode())
        os._exit(CANNOT_RUN)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOCTTY | (os.O_TRUNC if start["truncate"] else 0)
    fds = []
    for path in [start["out"]] + ([start["err"]] if start["err"] else []):
        try:
            fds.append(os.open(path, flags, 0o666))
        except OSError as e:
            os.write(2, ("cannot create %s: %s\n" % (path, e.strerror)).encode())
            os._exit(CANNOT_RUN)
    os.dup2(fds[0], 1)
    os.dup2(fds[-1], 2)


def joined_groups(spec):
    """The cgroups each child joins: the run's (first), and on cgroup v1 its pids and devices groups."""
    return spec.get("cgroups") or ([spec["cgroup"]] if spec.get("cgroup") else [])


def set_limits(pairs):
    """The job's soft resource limits ([kernel number, value], -1: unlimited), each at most the hard
    limit in force here: a job gets less than the node allows, never more (protos/rlimits.py)."""
    for number, soft in pairs:
        try:
            _, hard = resource.getrlimit(number)
            if hard != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft > hard):
                soft = hard
            resource.setrlimit(number, (soft, hard))
        except (ValueError, OSError, TypeError):
            pass


def shepherd(spec):
    """Start the children, wait for them, record each end; the shepherd's exit code."""
    os.chdir("/")
    groups = joined_groups(spec)
    events = Events(record_own(spec["folder"], spec["tag"], groups[0] if groups else ""), spec["events"])
    holds = [os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC) for path in spec.get("holds", ())]
    null = os.open(os.devnull, os.O_RDONLY)
    children = {}
    for index, one in enumerate(spec["children"]):
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)   # end of file: the child has exec'd (or ended)
        try:
            pid = os.fork()
        except OSError as e:
            os.close(ready_r)
            os.close(ready_w)
            try:
                os.write(one["stderr"], ("cannot start: %s\n" % e.strerror).encode())
            except OSError:
                pass
            events.say("exit %d %d" % (index, CANNOT_RUN << 8))
            continue
        if pid == 0:
            os.close(ready_r)
            child(spec, one, null)
        os.close(ready_w)
        while os.read(ready_r, 512):   # so that the pid said is already its own session's and group's
            pass
        os.close(ready_r)
        children[pid] = index
        events.say("pid %d %d %d" % (index, pid, start_time(pid)))
    for one in spec["children"]:   # the children have theirs; the daemon holds its own read ends
        for key in ("stdout", "stderr"):
            try:
                os.close(one[key])
            except OSError:
                pass
    while children:
        try:   # the group's number is the child's until it is reaped: kill what it left there first
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            break
        if info is None:
            continue
        if info.si_pid in children:
            try:
                os.killpg(info.si_pid, signal.SIGKILL)
            except OSError:
                pass
        _, status = os.waitpid(info.si_pid, 0)
        index = children.pop(info.si_pid, None)
        if index is not None:
            events.say("exit %d %d" % (index, status))
    del holds
    return 0


def record_own(folder, tag, cgroup=""):
    """FOLDER/TAG.record, whose first line is this process, for a daemon that adopts it, and the second
    the run's cgroup its children join (if any), for the fence keeper and that daemon; in place before
    any child runs. Returns it open for appending."""
    me = os.getpid()
    tmp = os.path.join(folder, ".%s.record.%d" % (tag, me))
    fd = os.open(tmp, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        # (not synced: the lines hold for this boot only, and a host crash that cuts them short is a new boot)
        own = "shepherd %d %d %s\n" % (me, start_time(me), boot_id()) + ("cgroup %s\n" % cgroup if cgroup else "")
        data = own.encode()
        if os.write(fd, data) != len(data):
            raise OSError("a short write")
        os.replace(tmp, os.path.join(folder, tag + ".record"))
    except BaseException:   # (a full disk): a record cut short would name no shepherd; nothing starts
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return fd


def ignore_signals():
    for sig in IGNORED:   # a stop aimed at the daemon, or at a job's group, is not for the shepherd
        signal.signal(sig, signal.SIG_IGN)


def serve(path):
    """The spawner: a single-threaded process the daemon asks to fork shepherds, which costs a
    fraction of a millisecond where starting Python costs tens. One request per connection: the spec
    (JSON, its descriptors passed with it and named by their place in "fds"), end of input; the
    answer is the shepherd's "PID START". It ends when the daemon that started it closes its
    standard input; the shepherds it forked go on without it."""
    import select
    import socket
    ignore_signals()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    while True:
        ready, _, _ = select.select([listener, 0], [], [], 1.0)
        while True:   # reap the shepherds that ended
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if 0 in ready and not os.read(0, 512):
            return 0
        if listener in ready:
            conn, _ = listener.accept()
            try:
                fork_one(conn, listener)
            except Exception as e:   # one bad request never ends the spawner
                sys.stderr.write("airnoded shepherd spawner: %s\n" % e)
            finally:
                conn.close()


def fork_one(conn, listener):
    import socket
    conn.settimeout(30)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 4096)
    chunks = [data]
    while True:
        more = conn.recv(1 << 16)
        if not more:
            break
        chunks.append(more)
    try:
        spec = json.loads(b"".join(chunks))
        mapped = dict(zip(spec.pop("fds"), fds))
        spec["events"] = mapped[spec["events"]]
        for one in spec["children"]:
            one["stdout"], one["stderr"] = mapped[one["stdout"]], mapped[one["stderr"]]
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                listener.close()
                conn.close()
                os.setsid()
                low = 3
                for fd in sorted(fds):   # the spawner's own descriptors stay with it
                    os.closerange(low, fd)
                    low = fd + 1
                os.closerange(low, 1 << 16)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)   # not the spawner's pipe from the daemon
                os.close(null)
                code = shepherd(spec)
            finally:
                os._exit(code)
        conn.sendall(("%d %d\n" % (pid, start_time(pid))).encode())
    finally:
        for fd in fds:
            os.close(fd)


def main():
    ignore_signals()
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        return serve(sys.argv[2])
    return shepherd(json.loads(sys.stdin.buffer.readline()))


if __name__ == "__main__":
    sys.exit(main())
