"""The shepherd: a small root process that starts a run's processes on this node (its batch script,
or the ranks of one step here) as their parent, waits for them and writes down how each ended.

It is what lets a node daemon restart (a package upgrade, `systemctl restart airnoded`, a crash)
without killing jobs: a process's exit status goes only to its parent, so the parent must be a
process that outlives the daemon. The daemon starts one shepherd per batch script and per step
on the node, each in a session of its own, and the unit file's KillMode=process leaves them
alone when the daemon stops. A new daemon finds them through their record and adopts the runs.

    python -I -S shepherd.py     (the spec: one line of JSON on standard input)

Standard library only, so that it starts in a few milliseconds with -I -S (isolated, no site).

The spec: {"record": path, "events": fd, "holds": [path, ...], "cgroup": path or "",
"uid": int or null, "gid": int, "groups": [int, ...], "children": [{"argv": [...], "env": {...},
"stdout": fd, "stderr": fd}, ...]}. fds are the shepherd's (passed by the daemon).

Each event is one line, appended to the record file (root's, in the run's root-owned folder)
and then written to the events FIFO the daemon reads:
    pid I PID START     child I runs, as process PID (leader of its own session and process
                        group), START its start time in clock ticks after boot
    exit I STATUS       child I ended; STATUS is waitpid's raw status
The daemon learns that the shepherd has ended from end of file on the events FIFO (the
shepherd holds its only write end). Output FIFOs listed in "holds" are held open read-write, so
that a child writing its output never gets EPIPE while no daemon reads: it waits instead.

Each child, before it runs anything of the job's owner: its own session, the run's cgroup (the
child joins it itself, as root, so nothing it forks escapes; it never runs if it cannot), the
owner's groups, gid and uid, default signal dispositions, standard input from /dev/null.
"""
import json
import os
import signal
import sys

IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGQUIT, signal.SIGUSR1,
           signal.SIGUSR2)
RESET = IGNORED + (signal.SIGXFSZ,)
NO_CGROUP = 125    # the child's exit code when it cannot join the run's cgroup
CANNOT_RUN = 126


def start_time(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


class Events:
    def __init__(self, record, fd):
        self.record = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
        if spec.get("cgroup"):
            try:
                with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            except OSError as e:
                os.write(one["stderr"], ("cannot enter the job's cgroup: %s\n" % e.strerror).encode())
                os._exit(NO_CGROUP)
        os.dup2(null, 0)
        os.dup2(one["stdout"], 1)
        os.dup2(one["stderr"], 2)
        os.closerange(3, 1 << 16)
        if spec.get("uid") is not None:
            os.setgroups(spec["groups"])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
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


def main():
    for sig in IGNORED:   # a stop aimed at the daemon, or at a job's group, is not for the shepherd
        signal.signal(sig, signal.SIG_IGN)
    spec = json.loads(sys.stdin.buffer.readline())
    os.chdir("/")
    events = Events(spec["record"], spec["events"])
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


if __name__ == "__main__":
    sys.exit(main())
