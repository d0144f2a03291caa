"""airrun: launch a step on the job's allocation (srun's job inside a batch script)."""
from __future__ import annotations

import os
import queue
import signal
import socket
import sys
import threading
import time

import click

from air.aircli.client import CliError, entry
from air.aircli.options import OptionError, export_environment, parse_hostlist
from air.protos.outputs import substitute
from air.protos.states import ExitCode


class _Command(click.Command):
    """srun's command line: `--kill-on-bad-exit[=0|1]` and `-K[0|1]` as Slurm writes them (a flag here),
    and the words as given, for a heterogeneous step (hetstep)."""

    def parse_args(self, ctx, args):
        ctx.meta["argv"] = list(args)
        takes_value = {name for p in self.params if isinstance(p, click.Option) and not p.is_flag
                       for name in p.opts}
        args, i = list(args), 0
        while i < len(args) and args[i].startswith("-") and args[i] not in ("-", "--"):
            word = args[i]
            if word in ("--kill-on-bad-exit=1", "-K", "-K1"):
                args[i] = "--kill-on-bad-exit"
            elif word in ("--kill-on-bad-exit=0", "-K0"):
                args[i] = "--no-kill-on-bad-exit"
            elif word in takes_value:
                i += 1
            i += 1
        return super().parse_args(ctx, args)


@click.command(cls=_Command,
               context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]})
@click.option("-N", "--nodes", type=click.IntRange(1), help="run on the job's first N nodes")
@click.option("--ntasks-per-node", type=click.IntRange(1), help="ranks on each node (default: one per GPU)")
@click.option("-w", "--nodelist", help="run on these nodes of the job (hostlist)")
@click.option("--gpus-per-task", type=click.IntRange(1), help="GPUs for each rank")
@click.option("-l", "--label", is_flag=True, help="prefix each output line with its rank")
@click.option("--kill-on-bad-exit/--no-kill-on-bad-exit", default=True, show_default=True,
              help="one rank failing ends the step")
@click.option("--jobid", type=int, help="the job to run in (default: $AIR_JOB_ID)")
@click.option("-n", "--ntasks", type=click.IntRange(1), help="ranks in all, as many on each node")
@click.option("-o", "--output", "output", help="each rank's stdout to this file (%t rank, %j job, %s step, %N node, "
              "%n node index, %A %a array, %u user, %x job name), appended")
@click.option("-e", "--error", "error", help="each rank's stderr to this file (default: with --output)")
@click.option("-u", "--unbuffered", is_flag=True, help="accepted: output is passed on line by line anyway")
@click.option("--het-group", type=click.IntRange(0),
              help="in a heterogeneous job: run on this component's nodes (default: the first's)")
@click.option("--export", "export", help="the ranks' environment: ALL (default), NONE, or [ALL,]VAR[=value],...")
@click.option("-W", "--wait", "wait_s", type=click.IntRange(0),
              help="accepted: the step waits for every rank (srun's --wait=0)")
@click.option("--open-mode", type=click.Choice(["append", "truncate"]), envvar="AIRRUN_OPEN_MODE",
              help="for --output/--error files (default: the job's, $SLURM_OPEN_MODE)")
@click.option("--config", hidden=True)
@click.option("-p", "--partition", help="outside a job: the allocation's partition")
@click.option("-t", "--time", "time_limit", help="outside a job: the allocation's time limit (Slurm's forms)")
@click.option("-A", "--account", help="outside a job: the account to charge")
@click.option("-q", "--qos", help="outside a job: the allocation's QOS")
@click.option("-J", "--job-name", help="outside a job: the allocation's name (default: the command's)")
@click.option("--gpus-per-node", type=click.IntRange(0), help="outside a job: GPUs on each node of the allocation")
@click.option("-c", "--cpus-per-task", type=click.IntRange(1), help="outside a job: CPUs for each task")
@click.option("-x", "--exclude", help="outside a job: nodes the allocation must not use (hostlist)")
@click.option("-C", "--constraint", help="outside a job: node features the allocation needs")
@click.option("--exclusive", is_flag=True, help="outside a job: whole nodes for the allocation")
@click.argument("command", nargs=-1, required=True)
@click.pass_context
def command(ctx, nodes, ntasks_per_node, nodelist, gpus_per_task, label, kill_on_bad_exit, jobid, ntasks, output,
            error, unbuffered, het_group, export, wait_s, open_mode, config, partition, time_limit, account, qos, job_name,
            gpus_per_node, cpus_per_task, exclude, constraint, exclusive, command):
    import hostlist
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    from air.aircli import hetstep
    if hetstep.SEPARATOR in command:   # `srun A : B`: a heterogeneous job's components, each its own step
        sys.exit(hetstep.run(ctx.command, ctx.info_name, ctx.meta["argv"]))
    try:
        environment = export_environment(export or "ALL", dict(os.environ))   # (checked: UTF-8 text)
    except OptionError as e:
        raise CliError(str(e)) from None
    if het_group is not None or (os.environ.get("SLURM_HET_SIZE") and not (nodelist or nodes)):
        if nodelist:
            raise CliError("give -w or --het-group, not both")
        group = hostlist.expand_hostlist(hetstep.group_nodes(het_group or 0, dict(os.environ)))   # (srun: the first)
        if nodes and nodes > len(group):
            raise CliError(f"-N {nodes}: het group {het_group or 0} has {len(group)} nodes")
        nodelist = hostlist.collect_hostlist(group[:nodes] if nodes else group)
    job_id = jobid or int(os.environ.get("AIR_JOB_ID", "0") or 0)
    # the run this srun belongs to, whatever --export kept (the controller refuses a stale run's step),
    # and only for the job it runs in: for another job (--jobid) its run says nothing
    environment.pop("AIR_RESTART_COUNT", None)
    if "AIR_RESTART_COUNT" in os.environ and os.environ.get("AIR_JOB_ID") == str(job_id):
        environment["AIR_RESTART_COUNT"] = os.environ["AIR_RESTART_COUNT"]
    try:
        names = hostlist.expand_hostlist(nodelist) if nodelist else []
        excluded = parse_hostlist("--exclude", exclude) if exclude else []   # (as airbatch's -x)
    except hostlist.BadHostlist as e:
        raise click.BadParameter(str(e), param_hint="'-w'") from None
    except OptionError as e:
        raise CliError(str(e)) from None
    count = len(names) or nodes or (int(os.environ.get("AIR_NNODES", "0") or 0) if job_id else 0) or 1
    if ntasks:
        if ntasks % count:
            raise CliError(f"--ntasks={ntasks} over {count} nodes: a step runs the same number of ranks on each "
                           "node; give a multiple of the nodes")
        if ntasks_per_node and ntasks_per_node != ntasks // count:
            raise CliError(f"--ntasks={ntasks} and --ntasks-per-node={ntasks_per_node} disagree")
        ntasks_per_node = ntasks // count
        nodes = nodes or (0 if names else count)
    elif not ntasks_per_node and ctx.info_name == "srun":   # srun: the job's tasks (one a node unless it
        # asked for more), not airrun's one rank per GPU
        ntasks_per_node = int(os.environ.get("SLURM_NTASKS_PER_NODE", "0") or 0) or 1
    client = Client(config)
    allocation = 0
    if not job_id:   # outside a job: an allocation for this step alone, given back once it ends (as srun)
        from air.protos.timefmt import parse_duration
        try:
            limit = parse_duration(time_limit) if time_limit else 0
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'-t'") from None
        per_node = ntasks_per_node or 1
        request = pb.JobRequest(
            name=job_name or "".join(c for c in os.path.basename(command[0]) if c >= " ")[:64] or "airrun",
            allocation=True, workdir=os.getcwd(),
            output="/dev/null", nodes=count, ntasks_per_node=per_node, cpus_per_task=cpus_per_task or 0,
            gpus_per_node=gpus_per_node if gpus_per_node is not None else (gpus_per_task or 0) * per_node,
            time_limit_s=limit, partition=partition or "", account=account or "", qos=qos or "", nodelist=names,
            exclude=excluded, constraint=constraint or "", exclusive=exclusive, no_requeue=True,
            submit_line=" ".join([ctx.info_name, *sys.argv[1:]])[:4096], submit_host=socket.gethostname()[:255])
        job_id = allocation = _allocate(client, request, ctx.info_name)
        ntasks_per_node = ntasks_per_node or per_node
    code, interrupted = 1, True   # (what the allocation's end says if _step does not return)
    renewing = _Renewing(client, allocation) if allocation else None
    try:
        code, interrupted = _step(client, job_id, nodes, names, ntasks_per_node, gpus_per_task, label,
                                  kill_on_bad_exit, output, error, open_mode, command, bool(allocation), environment)
    finally:
        if allocation:
            _release(client, allocation, code, interrupted, ctx.info_name)
            renewing.stop()
    if code:
        sys.exit(code)


PATIENCE_S = 60.0   # how long airrun's own allocation waits out a controller that does not answer


STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _ending(signum, frame):
    """Ctrl-C, SIGTERM or SIGHUP to airrun while it holds its own allocation: the step and the
    allocation end (nobody else would signal the ranks). Once: from here on nothing interrupts the
    allocation's release."""
    _hold_signals()
    raise KeyboardInterrupt


def _hold_signals() -> None:
    for signum in STOPPING:
        signal.signal(signum, signal.SIG_IGN)


def _on_signals(handler) -> None:
    """`handler` for Ctrl-C, SIGTERM and SIGHUP, except where airrun was started with one ignored
    (`nohup`, a background job of a script): it stays ignored."""
    for signum in STOPPING:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, handler)


def _patiently(call, request):
    """A call (a Client's method) that waits out a controller restart (up to PATIENCE_S), as the
    allocation must be followed and given back whatever happens meanwhile."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        try:
            return call(request)
        except CliError as e:
            if e.status != "UNAVAILABLE" or time.monotonic() > deadline:
                raise
        time.sleep(1.0)


def _allocate(client, request, prog: str) -> int:
    """Submit the allocation and wait until it runs; its id. Interrupted (Ctrl-C, SIGTERM, SIGHUP) or
    failing, it is given back."""
    from air.protos import air_pb2 as pb
    from air.protos.states import JobPhase
    pending: list[int] = []   # a signal while the job is submitted acts once its id is known

    def remember(signum, frame):
        pending.append(signum)
    _on_signals(remember)
    job_id, said = 0, False
    try:
        job_id = client.submit(pb.SubmitRequest(job=request)).job_id
        _on_signals(_ending)
        if pending:
            _hold_signals()
            raise KeyboardInterrupt
        while True:
            job = _patiently(client.get_job, pb.GetJobRequest(job_id=job_id))
            if job.phase == JobPhase.RUNNING:
                if said:
                    print(f"{prog}: job {job_id} has been allocated resources", file=sys.stderr, flush=True)
                return job_id
            if job.phase != JobPhase.PENDING:
                raise CliError(f"job {job_id} did not start: {job.reason_detail or 'it ended before it ran'}")
            if not said:
                print(f"{prog}: job {job_id} queued and waiting for resources", file=sys.stderr, flush=True)
                said = True
            time.sleep(0.2)
    except BaseException:
        _hold_signals()
        if job_id:
            _release(client, job_id, 1, True, prog)
        raise


INTERRUPTED = 130   # airrun's exit when it was interrupted


class _Renewing:
    """airrun renews its own allocation while it holds it: one that airrun stops renewing (killed,
    stopped or cut off) ends after the controller's inactive_limit_s, which each renewal's answer
    gives (the login node's configuration may differ). A renewal that fails is tried again soon;
    a controller restart keeps the allocation."""

    FIRST_S = 1.0   # the first renewal, and the period while the controller's limit is not known
    OFF_S = 3.0     # the period while the controller ends no allocation (its limit is 0, maybe for now;
    #                 a restart may bring the shortest limit it takes)

    def __init__(self, client, job_id: int):
        from air.protos import air_pb2 as pb
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(client, pb.JobFilter(job_ids=[job_id])), daemon=True).start()

    def _run(self, client, filt) -> None:
        every = self.FIRST_S
        while not self._done.wait(every):
            try:
                limit = client.keep_alive(filt, timeout=max(every, self.FIRST_S)).inactive_limit_s
            except Exception as e:   # (whatever it is, the next turn tries again: the step goes on)
                if not isinstance(e, CliError):
                    try:
                        print(f"airrun: warning: renewing the allocation: {e!r}", file=sys.stderr, flush=True)
                    except Exception:
                        pass
                every = min(every, 2.0)   # (a restart may have brought a shorter limit)
                continue
            every = max(0.5, limit / 6) if limit else self.OFF_S

    def stop(self) -> None:
        self._done.set()


def _release(client, job_id: int, code: int, interrupted: bool, prog: str) -> None:
    """Give the allocation back: it ends as the step did (COMPLETED or FAILED), asked again until it
    has (a shell not started yet, or not yet at its traps, misses it), and cancelled when it does not
    end, does not run, or airrun was interrupted; nothing interrupts this."""
    _hold_signals()
    from air.protos import air_pb2 as pb
    from air.protos.states import JobPhase
    filt = pb.JobFilter(job_ids=[job_id])
    try:
        for _ in range(0 if interrupted else 10):
            job = _patiently(client.get_job, pb.GetJobRequest(job_id=job_id))
            if job.phase != JobPhase.RUNNING:
                break
            _patiently(client.cancel, pb.CancelRequest(filter=filt, release=2 if code else 1))
            time.sleep(0.5)
        job = _patiently(client.get_job, pb.GetJobRequest(job_id=job_id))
        if job.phase not in (JobPhase.DONE, JobPhase.COMPLETING):
            _patiently(client.cancel, pb.CancelRequest(filter=filt))
    except CliError as e:
        if e.status == "FAILED_PRECONDITION":   # it ended meanwhile
            return
        print(f"{prog}: warning: job {job_id} may still hold its nodes ({e}); end it with aircancel {job_id}",
              file=sys.stderr, flush=True)


def _step(client, job_id, nodes, names, ntasks_per_node, gpus_per_task, label, kill_on_bad_exit, output, error,
          open_mode, command, own_allocation: bool, environment: dict[str, str]) -> tuple[int, bool]:
    """Run the step in job `job_id`, its ranks' output passed on; the step's exit code, and whether
    airrun was interrupted."""
    import grpc
    from air.protos import air_pb2 as pb
    from air.protos import air_pb2_grpc as rpc
    from air.protos import keepalive
    from air.protos import rlimits
    from air.protos.credential import signed
    spec = pb.StepSpec(job_id=job_id, nodes=nodes or 0, nodelist=names, ntasks_per_node=ntasks_per_node or 0,
                       gpus_per_task=gpus_per_task or 0, argv=list(command), environment=environment,
                       rlimits=rlimits.capture(),
                       workdir=os.getcwd())
    step = client.create_step(spec)
    if open_mode is None:
        open_mode = "truncate" if os.environ.get("SLURM_OPEN_MODE") == "t" else "append" \
            if os.environ.get("SLURM_OPEN_MODE") == "a" else "truncate"   # srun's default
    files = _RankFiles(step, output, error, open_mode == "append") if output or error else None
    auth = client.config.controller.authenticator()
    # a node daemon that restarts keeps the step's ranks; airrun follows them again once it is back,
    # for as long as the daemon's lease lasts (after that its node stops them)
    patience = client.config.controller.fence_after_s
    events: queue.Queue = queue.Queue()
    followers = []
    for node in step.nodes:
        channel = grpc.insecure_channel(node.address, options=list(keepalive.CLIENT_OPTIONS))
        stub = rpc.NodeAgentStub(signed(channel, auth, node.node))
        follower = _Follower(node.node, stub, step, len(node.ranks), events, patience)
        followers.append(follower)
        threading.Thread(target=follower.run, daemon=True).start()
    watched = threading.Event()
    threading.Thread(target=_watch, args=(followers, watched), daemon=True).start()

    out, err = sys.stdout.buffer, sys.stderr.buffer
    remaining, streams_left = step.world_size, len(followers)

    def stopping(signum, frame):
        # The ranks get the same signal from their node daemons: let them checkpoint and end on their
        # own; leaving now would cancel the step and kill them mid-write. SIGKILL ends airrun itself.
        err.write(b"airrun: SIGTERM: waiting for the ranks to stop\n")
        err.flush()

    if own_allocation:   # nobody else signals the ranks: ending the streams stops them
        _on_signals(_ending)
    else:
        signal.signal(signal.SIGTERM, stopping)
    known = False   # the step's outcome is known (the loop ended, or was interrupted)
    verdict, cancelled = _Verdict(patience), False
    fenced_nodes: set[str] = set()
    try:
        while remaining and streams_left:
            held = verdict.held   # (a rank's failure waiting for the word on a node whose stream broke)
            if verdict.settle(any(f.lost for f in followers), time.monotonic()) and kill_on_bad_exit and remaining:
                err.write(f"airrun: rank {held[0]} exited with {verdict.first_bad}; ending the step\n".encode())
                break
            try:
                kind, value = events.get(timeout=0.25 if verdict.held else None)
            except queue.Empty:
                continue
            if kind == "end":
                streams_left -= 1
                if value:  # a node's stream broke: its ranks are gone, most likely with the node
                    err.write(f"airrun: error: {value}; ending the step\n".encode())
                    verdict.node_lost()
                    if kill_on_bad_exit:
                        break
                continue
            node, event = value
            if event.exited:
                remaining -= 1
                code = event.exit_code or (128 + event.exit_signal if event.exit_signal else 0)
                if verdict.fenced_loss(code, event.fenced) and node not in fenced_nodes:
                    fenced_nodes.add(node)   # (the step's code will say a node was lost: the line says why)
                    err.write(f"airrun: error: {node}: rank {event.rank} was stopped by its node's fence (the "
                              f"node lost the controller); the step lost the node\n".encode())
                failed = verdict.rank_exited(event.rank, code, event.exit_code, event.exit_signal, event.fenced,
                                             any(f.lost for f in followers), time.monotonic())
                # (a rank that stopped cleanly for requeue is not a failure: the others follow)
                if failed and kill_on_bad_exit and remaining:
                    err.write(f"airrun: rank {event.rank} exited with {code}; ending the step\n".encode())
                    break
                continue
            stream = (files.stream(event.rank, event.stderr) if files else None) or (err if event.stderr else out)
            stream.write((f"{event.rank}: ".encode() if label else b"") + event.data)
            stream.flush()
        verdict.settle(False, float("inf"))   # a failure still waiting for a node's word: it stands
        known = True
    except KeyboardInterrupt:
        known, cancelled = True, True
        verdict.first_bad = INTERRUPTED
    finally:
        if own_allocation:   # its outcome and the release are not interrupted
            _hold_signals()
        watched.set()
        for follower in followers:
            follower.cancel()
        if files:
            files.close()
        try:   # the step's outcome, for its record (airacct); the step has ended whatever the answer
            if known:
                outcome = verdict.outcome
                if verdict.first_bad and outcome == (0, 0) and not cancelled:   # (a node lost: airrun's own code)
                    outcome = (min(255, verdict.first_bad), 0)
                client.end_step(pb.StepEnd(job_id=step.job_id, step_id=step.step_id, run=step.run,
                                                  exit_code=outcome[0], exit_signal=min(127, outcome[1]),
                                                  cancelled=cancelled), timeout=5.0)
        except CliError:
            pass
    return verdict.first_bad, cancelled


class _Verdict:
    """What a step's end says: its first failed rank's code (or ExitCode.NODE_LOST when a node was lost),
    and that rank's (exit code, signal).

    A rank that fails while the stream of another node of the step is broken most likely failed because
    of it (its collective's peer died with that node): its failure is held until that node's daemon is
    back (the failure stands) or the node is given up (the step lost a node: the job goes back to the
    queue instead of failing), for the patience a broken stream gets and a second more at most."""

    def __init__(self, patience: float):
        self.patience = patience
        self.first_bad = 0
        self.outcome = (0, 0)
        self.held: tuple[int, int, tuple[int, int], float] | None = None   # (rank, code, outcome, until)

    @staticmethod
    def _fenced_stop(code: int, fenced: bool) -> bool:
        """A rank its node's fence stopped (it lost the controller): its run is lost there, not failed."""
        return fenced and code not in (0, ExitCode.REQUEUE)

    def fenced_loss(self, code: int, fenced: bool) -> bool:
        """Whether this exit makes the step's code NODE_LOST because its node's fence stopped the rank
        (asked before rank_exited takes it: a code the step has already stands)."""
        return self._fenced_stop(code, fenced) and self.first_bad in (0, ExitCode.NODE_LOST)

    def rank_exited(self, rank: int, code: int, exit_code: int, exit_signal: int, fenced: bool,
                    any_lost: bool, now: float) -> bool:
        """A rank's exit; whether it is the step's first failure (known now, not held)."""
        if self._fenced_stop(code, fenced):   # (the other ranks are left their grace to checkpoint and stop)
            self.first_bad = self.first_bad or ExitCode.NODE_LOST
            return False
        if not code or self.first_bad or self.held:
            return False
        outcome = (exit_code, 0 if exit_code else exit_signal)
        if code == ExitCode.REQUEUE:   # stopped cleanly for requeue: the others follow
            self.first_bad, self.outcome = code, outcome
            return False
        if any_lost:
            self.held = (rank, code, outcome, now + self.patience + 1.0)
            return False
        self.first_bad, self.outcome = code, outcome
        return True

    def node_lost(self) -> None:
        """A node's stream ended for good: its ranks are gone with it (a failure held meanwhile was its
        consequence)."""
        self.held = None
        self.first_bad = self.first_bad or ExitCode.NODE_LOST

    def settle(self, any_lost: bool, now: float) -> bool:
        """A held failure stands once no node's stream is broken, or its time is up; whether it did now."""
        if self.held is None or (any_lost and now < self.held[3]):
            return False
        _, code, outcome, _ = self.held
        self.held = None
        if self.first_bad:
            return False
        self.first_bad, self.outcome = code, outcome
        return True


def expand(pattern: str, step, rank: int, env: dict[str, str]) -> str:
    """srun's filename patterns for one rank's file."""
    node_index = next((i for i, n in enumerate(step.nodes) if rank in n.ranks), 0)
    job = str(step.job_id)
    values = {"t": str(rank), "j": job, "J": f"{job}.{step.step_id}", "s": str(step.step_id),
              "N": step.nodes[node_index].node, "n": str(node_index), "u": env.get("USER", ""),
              "x": env.get("AIR_JOB_NAME", ""), "A": env.get("SLURM_ARRAY_JOB_ID", job),
              "a": env.get("SLURM_ARRAY_TASK_ID", "4294967294")}
    return substitute(pattern, values)


class _RankFiles:
    """--output/--error: each rank's lines into its own file (ranks whose patterns name the same file
    share it). Every file is opened before the first rank is followed: one that cannot be opened ends
    airrun before it has anything to lose."""

    def __init__(self, step, output: str | None, error: str | None, append: bool):
        self.open: dict[str, object] = {}
        self.paths: dict[tuple[int, bool], str] = {}
        env = dict(os.environ)
        for rank in range(step.world_size):
            for is_err, pattern in ((False, output), (True, error or output)):
                if not pattern:
                    continue
                path = self.paths[(rank, is_err)] = expand(pattern, step, rank, env)
                if path not in self.open:
                    try:
                        self.open[path] = open(path, "ab" if append else "wb")
                    except OSError as e:
                        self.close()
                        raise CliError(f"cannot open {path} for rank {rank}'s output: {e.strerror}") from None

    def stream(self, rank: int, stderr: bool):
        path = self.paths.get((rank, stderr))
        return self.open[path] if path else None

    def close(self) -> None:
        for f in self.open.values():
            f.close()


class _Follower:
    """One node's part of the step: its events, and again after its daemon restarted (attach), each
    rank's exit passed on once."""

    def __init__(self, node: str, stub, step, ranks: int, events: queue.Queue, patience: float):
        self.node, self.stub, self.step, self.ranks = node, stub, step, ranks
        self.events, self.patience = events, patience
        self.exited: set[int] = set()
        self.call = None
        self.cancelled = False
        self.lost = False   # its stream broke, or its daemon went silent, and no event since
        self.lock = threading.Lock()
        self.heard = time.monotonic()   # the current call's start or last message
        self.beats = False   # the current call had a beat (protos/keepalive.py): silence means its daemon is gone
        self.beating = False  # some call had one: this node's daemon sends them
        self.ended = False   # its one ("end", ...) is sent

    def _end(self, problem: str) -> None:
        """Tell the step this node's part is over (with a problem: the node is lost); once."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
        self.events.put(("end", problem))

    def check(self, now: float) -> None:
        """(the watch, every second) A daemon that sends beats and has said nothing for
        keepalive.SILENCE_S is frozen or cut off: the node is lost meanwhile, and given up after the
        patience. Its call is left alone until then: cancelling it would have a daemon that is only
        slow kill the ranks. Given up, the call is cancelled: that node's ranks are killed when its
        daemon comes back, rather than block on output nobody reads."""
        from air.protos import keepalive
        with self.lock:
            if not self.beats or self.ended or self.cancelled:
                return
            silence = now - self.heard
            if silence > keepalive.SILENCE_S:
                self.lost = True
            give_up = silence > keepalive.SILENCE_S + self.patience
            call = self.call
        if give_up:
            self._end(f"{self.node}: no word from its node daemon for {silence:.0f} s")
            call.cancel()

    def stalled(self, now: float) -> None:
        """airrun itself was stopped (Ctrl-Z, a paused VM): the silence was its own."""
        with self.lock:
            self.heard = max(self.heard, now)

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            if self.call is not None:
                self.call.cancel()

    def run(self) -> None:
        import grpc
        from air.protos import air_pb2 as pb
        attach, lost_since, problem = False, None, ""
        while True:
            began = time.monotonic()
            with self.lock:
                if self.cancelled:
                    return self._end("")
                if self.ended:
                    return
                self.heard, self.beats = began, False   # (each call its own: a restart may bring an older daemon)
            # (made outside the lock: signing it may wait on munged, and the watch and cancel() take the lock)
            call = self.stub.RunStep(pb.RunStepRequest(job_id=self.step.job_id, step_id=self.step.step_id,
                                                       attach=attach, beats=True))
            with self.lock:
                self.call = call
                if self.cancelled or self.ended:
                    call.cancel()
            answered = False
            try:
                for event in call:
                    answered = True
                    with self.lock:
                        if self.ended:   # (given up meanwhile: nothing more of it counts)
                            return
                        self.heard = time.monotonic()
                        self.beats = self.beats or event.beat
                        self.beating = self.beating or event.beat
                    lost_since, self.lost = None, False
                    if event.beat:
                        continue
                    if event.exited:
                        if event.rank in self.exited:
                            continue   # seen before the daemon restarted
                        self.exited.add(event.rank)
                    self.events.put(("event", (self.node, event)))
                if len(self.exited) >= self.ranks:
                    return self._end("")
                problem = "its node daemon stopped"
            except grpc.RpcError as e:
                if self.cancelled:
                    return self._end("")
                # the daemon is away (restarting) or went away mid-stream: follow again; anything else is final
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    return self._end(f"{self.node}: {e.details() or e.code().name}")
                problem = e.details() or e.code().name
            self.lost = True
            now = time.monotonic()
            # a call its daemon answered is a new loss when it breaks; one that waited on a daemon that
            # never answered (frozen, cut off) goes on with the loss before it. A daemon without beats
            # says nothing on a quiet step: a call of its that was up a while counts as answered.
            reached = answered or (not self.beating and now - began > 1.0)
            if reached:
                lost_since = None
            lost_since = lost_since or now
            if now - lost_since > self.patience:
                return self._end(f"{self.node}: {problem}")
            # attach only to a step the daemon has started: a first call that never reached it (a stalled
            # connection) starts it again, since attach finds only steps a daemon adopted
            attach = attach or reached
            time.sleep(0.25)


def _watch(followers: list[_Follower], done: threading.Event) -> None:
    """One thread for all of a step's nodes: each follower's silence checked every second."""
    last = time.monotonic()
    while not done.wait(1.0):
        now = time.monotonic()
        for follower in followers:
            if now - last > 3.0:   # (this process was stopped: nobody was silent)
                follower.stalled(now)
            else:
                follower.check(now)
        last = now


main = entry(command, "airrun")

if __name__ == "__main__":
    main()
