/* air-shepherd: the shepherd of shepherd.py, as a small C program.
 *
 * It does what shepherd.py's shepherd() does, in the same order and with the same files, events and
 * exit codes (shepherd.py's docstring is the contract). A shepherd costs the node a fork and an exec
 * of this program, where a Python shepherd costs a fork of a Python image, whose pages the two
 * processes then copy as they run: about four milliseconds of CPU a run. The node daemon starts it
 * with posix_spawn (no copy of the daemon), in a session of its own. Without this program (no C
 * compiler where the package was built) the daemon starts shepherd.py instead.
 *
 *     air-shepherd < SPEC
 *
 * SPEC: fields, each ended by a NUL byte (no field can hold one: paths, argv and environment strings
 * cannot), in this order:
 *     AIRSPEC1 FOLDER TAG EVENTS-FD UID ("" for the daemon's own user) GID
 *     N-GROUPS GROUP...  N-CGROUPS CGROUP-DIR...  N-RLIMITS (NUMBER SOFT)...  N-HOLDS HOLD-PATH...
 *     N-CHILDREN, then for each child: STDOUT-FD STDERR-FD WORKDIR OUTPUT ERROR TRUNCATE (0 or 1)
 *         ARGC ARG... ENVC NAME=VALUE... (ARGC 0: a command the daemon could not pass; it fails to run)
 * The descriptors are this process's (placed by the daemon); every other one but 0, 1 and 2 is
 * closed first. A malformed spec ends it with exit code 2 before it writes anything. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SPEC (1u << 30)   /* bytes: a step's ranks each with their environment (512 of 1 MiB, say) */
#define MAX_ITEMS 65536        /* of any list in the spec */
#define NO_CGROUP 125
#define CANNOT_RUN 126

static const int IGNORED[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGQUIT, SIGUSR1, SIGUSR2};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

struct child {
    int out, err;
    const char *cwd, *output, *error;   /* output "": none (the job's own opens, below) */
    int truncate;
    char **argv, **env;
};

struct spec {
    const char *folder, *tag;
    int events;
    int has_uid;
    uid_t uid;
    gid_t gid;
    size_t ngroups, ncgroups, nrlimits, nholds, nchildren;
    gid_t *groups;
    const char **cgroups, **holds;
    long long (*rlimits)[2];
    struct child *children;
};

/* ------------------------------------------------------------------ reading the spec */

static char *buf, *pos, *end;

static void bad(const char *what) {
    dprintf(2, "air-shepherd: bad spec: %s\n", what);
    _exit(2);
}

static const char *field(void) {
    char *nul = pos < end ? memchr(pos, 0, (size_t)(end - pos)) : NULL;
    if (!nul)
        bad("a field is cut short");
    const char *f = pos;
    pos = nul + 1;
    return f;
}

static long long number(long long lo, long long hi) {
    const char *f = field();
    char *stop;
    errno = 0;
    long long v = strtoll(f, &stop, 10);
    if (errno || !*f || *stop || v < lo || v > hi)
        bad("a number is out of range");
    return v;
}

static size_t count(void) { return (size_t)number(0, MAX_ITEMS); }

static void *items(size_t n, size_t size) {
    void *p = calloc(n + 1, size);   /* (+1: room for a NULL at the end of argv and env) */
    if (!p)
        bad("out of memory");
    return p;
}

static char **strings(void) {
    size_t n = count();
    char **v = items(n, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        v[i] = (char *)field();
    return v;
}

static void read_spec(struct spec *s) {
    size_t size = 0, cap = 1 << 16;
    buf = malloc(cap);
    for (;;) {
        if (!buf)
            bad("out of memory");
        ssize_t n = read(0, buf + size, cap - size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            bad("cannot read it");
        if (n == 0)
            break;
        size += (size_t)n;
        if (size == cap) {
            if (cap >= MAX_SPEC)
                bad("too large");
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    pos = buf;
    end = buf + size;
    if (strcmp(field(), "AIRSPEC1") != 0)
        bad("not a spec");
    s->folder = field();
    s->tag = field();
    s->events = (int)number(3, INT_MAX);
    const char *uid = field();
    s->has_uid = *uid != 0;
    if (s->has_uid) {
        pos = (char *)uid;
        s->uid = (uid_t)number(0, 0xfffffffeLL);
    }
    s->gid = (gid_t)number(0, 0xfffffffeLL);
    s->ngroups = count();
    s->groups = items(s->ngroups, sizeof(gid_t));
    for (size_t i = 0; i < s->ngroups; i++)
        s->groups[i] = (gid_t)number(0, 0xfffffffeLL);
    s->ncgroups = count();
    s->cgroups = items(s->ncgroups, sizeof(char *));
    for (size_t i = 0; i < s->ncgroups; i++)
        s->cgroups[i] = field();
    s->nrlimits = count();
    s->rlimits = items(s->nrlimits, sizeof(*s->rlimits));
    for (size_t i = 0; i < s->nrlimits; i++) {
        s->rlimits[i][0] = number(0, RLIM_NLIMITS - 1);
        s->rlimits[i][1] = number(-1, LLONG_MAX);
    }
    s->nholds = count();
    s->holds = items(s->nholds, sizeof(char *));
    for (size_t i = 0; i < s->nholds; i++)
        s->holds[i] = field();
    s->nchildren = count();
    s->children = items(s->nchildren, sizeof(struct child));
    for (size_t i = 0; i < s->nchildren; i++) {
        struct child *c = &s->children[i];
        c->out = (int)number(3, INT_MAX);
        c->err = (int)number(3, INT_MAX);
        c->cwd = field();
        c->output = field();
        c->error = field();
        c->truncate = (int)number(0, 1);
        c->argv = strings();
        c->env = strings();
    }
    if (pos != end)
        bad("more than a spec");
}

/* ------------------------------------------------------------------ the shepherd */

static int by_number(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Close every descriptor but 0-2 and those the spec names (the daemon's may leak through). */
static void close_others(const struct spec *s) {
    size_t n = 0;
    int *keep = items(2 * s->nchildren + 1, sizeof(int));
    keep[n++] = s->events;
    for (size_t i = 0; i < s->nchildren; i++) {
        keep[n++] = s->children[i].out;
        keep[n++] = s->children[i].err;
    }
    qsort(keep, n, sizeof(int), by_number);
    int low = 3;
    for (size_t i = 0; i <= n; i++) {   /* the gaps between them, then all above the last */
        unsigned high = i < n ? (unsigned)keep[i] - 1 : ~0u;
        if (i < n && keep[i] < low)
            continue;
        if (high >= (unsigned)low && syscall(SYS_close_range, (unsigned)low, high, 0) != 0)
            for (int fd = low; fd <= (int)(high < (1u << 16) ? high : (1u << 16)); fd++)
                close(fd);
        if (i < n)
            low = keep[i] + 1;
    }
    free(keep);
}

static unsigned long long start_time(pid_t pid) {
    char path[64], data[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, data, sizeof data - 1);
    close(fd);
    if (n <= 0)
        return 0;
    data[n] = 0;
    char *p = strrchr(data, ')');
    if (!p)
        return 0;
    /* after the name: state is field 0, the start time field 19 */
    for (int i = 0; i < 20; i++) {
        p = strchr(p + 1, ' ');
        if (!p)
            return 0;
    }
    return strtoull(p + 1, NULL, 10);
}

static void boot_id(char *out, size_t size) {
    out[0] = 0;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, out, size - 1);
    close(fd);
    if (n < 0)
        n = 0;
    out[n] = 0;
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' '))
        out[--n] = 0;
}

/* 0 when all of it was written */
static int write_all(int fd, const char *data, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, data, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        data += w;
        n -= (size_t)w;
    }
    return 0;
}

/* FOLDER/TAG.record, whose first line is this process, for a daemon that adopts it, and the second its
 * children's cgroup (if any); in place (written aside, renamed) before any child runs, or the shepherd
 * ends. Returns it open for appending. Not synced: what it says holds for this boot only, and a crash
 * of the host that cuts it short is a new boot, which is how a daemon takes a record it cannot read
 * (shepherding._shepherd_of). */
static int record_own(const struct spec *s) {
    char tmp[PATH_MAX], final[PATH_MAX], line[128], boot[64];
    pid_t me = getpid();
    if (snprintf(tmp, sizeof tmp, "%s/.%s.record.%d", s->folder, s->tag, (int)me) >= (int)sizeof tmp ||
        snprintf(final, sizeof final, "%s/%s.record", s->folder, s->tag) >= (int)sizeof final)
        bad("the folder's name is too long");
    int fd = open(tmp, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        dprintf(2, "air-shepherd: cannot write %s: %s\n", tmp, strerror(errno));
        _exit(1);
    }
    boot_id(boot, sizeof boot);
    int n = snprintf(line, sizeof line, "shepherd %d %llu %s\n", (int)me, start_time(me), boot);
    int failed = write_all(fd, line, (size_t)n);
    if (s->ncgroups > 0)   /* the run's group, for the fence keeper and a daemon that adopts it */
        failed = failed || write_all(fd, "cgroup ", 7) || write_all(fd, s->cgroups[0], strlen(s->cgroups[0])) ||
                 write_all(fd, "\n", 1);
    if (failed) {   /* (a full disk): a record cut short would name no shepherd; nothing starts */
        dprintf(2, "air-shepherd: cannot write %s: %s\n", tmp, strerror(errno ? errno : ENOSPC));
        unlink(tmp);
        _exit(1);
    }
    if (rename(tmp, final) != 0) {
        dprintf(2, "air-shepherd: cannot write %s: %s\n", final, strerror(errno));
        _exit(1);
    }
    return fd;
}

static int record_fd = -1;

/* The record first: a daemon that reads the FIFO and dies leaves it to the next one. */
static void say(const struct spec *s, const char *line) {
    write_all(record_fd, line, strlen(line));   /* (a write that fails here: the pipe or FIFO still has it) */
    write_all(s->events, line, strlen(line));
}

static void set_limits(const struct spec *s) {
    for (size_t i = 0; i < s->nrlimits; i++) {
        struct rlimit r;
        int number = (int)s->rlimits[i][0];
        if (getrlimit(number, &r) != 0)
            continue;
        rlim_t soft = s->rlimits[i][1] < 0 ? RLIM_INFINITY : (rlim_t)s->rlimits[i][1];
        if (r.rlim_max != RLIM_INFINITY && (soft == RLIM_INFINITY || soft > r.rlim_max))
            soft = r.rlim_max;
        r.rlim_cur = soft;
        setrlimit(number, &r);
    }
}

static int open_output(const char *path, int truncate) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOCTTY | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0666);
    if (fd < 0) {
        dprintf(2, "cannot create %s: %s\n", path, strerror(errno));
        _exit(CANNOT_RUN);
    }
    return fd;
}

/* As the job's owner: its working directory, then its output files (made, truncated or appended to,
 * with the owner's rights only); failures go to the daemon's start-up status pipe (fds 1 and 2 yet). */
static void open_outputs(const struct child *c) {
    if (chdir(c->cwd) != 0) {
        dprintf(2, "cannot enter the working directory %s: %s\n", c->cwd, strerror(errno));
        _exit(CANNOT_RUN);
    }
    int out = open_output(c->output, c->truncate);
    int err = *c->error ? open_output(c->error, c->truncate) : out;
    if (dup2(out, 1) < 0 || dup2(err, 2) < 0)
        _exit(CANNOT_RUN);
    close(out);
    if (err != out)
        close(err);
}

/* In the forked child: never returns. */
static void child(const struct spec *s, const struct child *c, int null) {
    const char *step = "setsid";
    if (!c->argv[0]) {   /* the daemon could not pass its command (a NUL byte in it): it fails as execve would */
        dprintf(c->err, "cannot run: a NUL byte in its command or environment\n");
        _exit(CANNOT_RUN);
    }
    if (setsid() < 0)
        goto fail;
    for (size_t i = 0; i < s->ncgroups; i++) {
        char path[PATH_MAX], pid[32];
        int fd = -1;
        if (snprintf(path, sizeof path, "%s/cgroup.procs", s->cgroups[i]) < (int)sizeof path)
            fd = open(path, O_WRONLY | O_CLOEXEC);
        int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
        if (fd < 0 || write(fd, pid, (size_t)n) != n) {
            dprintf(c->err, "cannot enter the job's cgroup: %s\n", strerror(errno));
            _exit(NO_CGROUP);
        }
        close(fd);
    }
    set_limits(s);
    step = "dup2";
    if (dup2(null, 0) < 0 || dup2(c->out, 1) < 0 || dup2(c->err, 2) < 0)
        goto fail;
    if (syscall(SYS_close_range, 3u, ~0u, 0) != 0)
        for (int fd = 3; fd < 1 << 16; fd++)
            close(fd);
    if (s->has_uid) {
        step = "setgroups";
        if (setgroups(s->ngroups, s->groups) != 0)
            goto fail;
        step = "setgid";
        if (setgid(s->gid) != 0)
            goto fail;
        step = "setuid";
        if (setuid(s->uid) != 0)
            goto fail;
    }
    if (*c->output)
        open_outputs(c);
    /* every disposition the default, through the kernel: posix_spawn leaves the C library's own two
     * signals (32 and 33) ignored in this program, and glibc's sigaction will not touch them */
    char dfl[64] = {0};   /* (a kernel sigaction of zeros: SIG_DFL, no flags, an empty mask) */
    for (int sig = 1; sig < 65; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            syscall(SYS_rt_sigaction, sig, dfl, NULL, 8);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(c->argv[0], c->argv, c->env);
    dprintf(2, "cannot run %s: %s\n", c->argv[0], strerror(errno));
    _exit(CANNOT_RUN);
fail:
    dprintf(2, "cannot run %s: %s: %s\n", c->argv[0], step, strerror(errno));
    _exit(CANNOT_RUN);
}

int main(void) {
    static struct spec s;
    for (size_t i = 0; i < COUNT(IGNORED); i++)   /* a stop aimed at the daemon, or at a job's group, */
        signal(IGNORED[i], SIG_IGN);                /* is not for the shepherd */
    read_spec(&s);
    close_others(&s);
    if (chdir("/") != 0)
        _exit(1);
    record_fd = record_own(&s);
    for (size_t i = 0; i < s.nholds; i++)   /* held open (never read): see shepherd.py */
        if (open(s.holds[i], O_RDWR | O_NONBLOCK | O_CLOEXEC) < 0) {
            dprintf(2, "air-shepherd: cannot hold %s: %s\n", s.holds[i], strerror(errno));
            _exit(1);
        }
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0)
        _exit(1);
    pid_t *pids = items(s.nchildren, sizeof(pid_t));
    size_t left = 0;
    char line[128];
    for (size_t i = 0; i < s.nchildren; i++) {
        int ready[2];   /* end of file: the child has exec'd (or ended) */
        if (pipe2(ready, O_CLOEXEC) != 0) {
            dprintf(s.children[i].err, "cannot start: %s\n", strerror(errno));
            snprintf(line, sizeof line, "exit %zu %d\n", i, CANNOT_RUN << 8);
            say(&s, line);
            continue;
        }
        pid_t pid = fork();
        if (pid < 0) {
            close(ready[0]);
            close(ready[1]);
            dprintf(s.children[i].err, "cannot start: %s\n", strerror(errno));
            snprintf(line, sizeof line, "exit %zu %d\n", i, CANNOT_RUN << 8);
            say(&s, line);
            continue;
        }
        if (pid == 0) {
            close(ready[0]);
            child(&s, &s.children[i], null);
        }
        close(ready[1]);
        char sink[512];   /* so that the pid said is already its own session's and group's */
        for (;;) {
            ssize_t r = read(ready[0], sink, sizeof sink);
            if (r > 0 || (r < 0 && errno == EINTR))
                continue;
            break;
        }
        close(ready[0]);
        pids[i] = pid;
        left++;
        snprintf(line, sizeof line, "pid %zu %d %llu\n", i, (int)pid, start_time(pid));
        say(&s, line);
    }
    for (size_t i = 0; i < s.nchildren; i++) {   /* the children have theirs; the daemon holds its own */
        close(s.children[i].out);
        close(s.children[i].err);
    }
    free(buf);   /* every child has exec'd or ended: the spec (up to MAX_SPEC) is not kept for the run's life */
    buf = NULL;
    while (left > 0) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        /* the group's number is the child's until it is reaped: kill what it left there first */
        if (waitid(P_ALL, 0, &info, WEXITED | WNOWAIT) != 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (info.si_pid <= 0)
            continue;
        size_t index = s.nchildren;
        for (size_t i = 0; i < s.nchildren; i++)
            if (pids[i] == info.si_pid)
                index = i;
        if (index < s.nchildren)
            kill(-info.si_pid, SIGKILL);
        int status = 0;
        while (waitpid(info.si_pid, &status, 0) < 0 && errno == EINTR)
            ;
        if (index < s.nchildren) {
            pids[index] = 0;
            left--;
            snprintf(line, sizeof line, "exit %zu %d\n", index, status);
            say(&s, line);
        }
    }
    return 0;
}
