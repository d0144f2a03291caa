"""Checkpoints through torch.distributed.checkpoint: each rank writes its own part, and a checkpoint
counts only once it is complete.

Layout: CHECKPOINT_DIR/step-000000120-run3/ holds DCP's files of step 120 written by run 3 (the job's
$AIR_RESTART_COUNT); rank 0 writes COMPLETE there last ("step 120", "run 3"; written aside, fsynced,
then renamed), after every rank has finished. Restore takes, of the directories that have COMPLETE
and whose metadata reads back, the one of the newest run, and of that run the highest step; one
without COMPLETE (interrupted mid-write) or with unreadable metadata is skipped with a warning. The
newest `keep` complete checkpoints stay. A folder named step-N without a run (written before runs
were recorded) counts as run 0.

Runs: when a node is cut off, a stale run of the job may still be writing beside the new one. Each
run registers itself in CHECKPOINT_DIR/runs/ (a file run-N, made with O_EXCL) when its Checkpointer
starts. A writer never writes into another run's folder (the run is part of the name); before it
writes any data, and again just before COMPLETE, it looks for a newer run (registered, or with a
checkpoint folder) and, if there is one, refuses with StaleRunError; purging never deletes a
checkpoint of a run newer than the writer's. A COMPLETE that lands in the instant after a newer run
registered is harmless: restore ranks every checkpoint of the newer run above it.

Saves are asynchronous by default: save() copies the state into staging buffers that are allocated
once and reused (pinned host memory for GPU tensors), then a background thread writes them, on a
process group of its own, while training goes on; one save is in flight at a time, and a save, a
restore or the end of the process waits for it. save(..., blocking=True) (at a stop) returns only
once the checkpoint is complete.

What goes in: every nn.Module and optimizer of the state (through DCP's state-dict helpers),
anything else with state_dict()/load_state_dict(), plain values, and per rank the RNG states
(python, torch, CUDA, numpy) and the state of per-rank objects such as a ResumableSampler.
"""
from __future__ import annotations

import atexit
import copy
import logging
import os
import threading
import warnings
import random
import re
import shutil
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from air.runtime.context import Context
from air.runtime.data import ResumableSampler

log = logging.getLogger("air.runtime")
# DCP warns on every save without a process group; a single-rank job is meant to save that way.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")
STEP_DIR = re.compile(r"^step-(\d+)(?:-run(\d+))?$")
RUN_FILE = re.compile(r"^run-(\d+)$")
MARKER = "COMPLETE"
RUNS = "runs"
PER_RANK = (ResumableSampler,)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy
        numpy.random.set_state(state["numpy"])


class _Staging:
    """Reused buffers for the staging copy: one per tensor position in the state, allocated on first
    use (pinned when the source is on a GPU) and kept while shapes and dtypes stay the same."""

    def __init__(self):
        self._buffers: dict[tuple, torch.Tensor] = {}

    def stage(self, value, path: tuple = ()):
        if torch.is_tensor(value):
            key = path
            buf = self._buffers.get(key)
            if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
                buf = torch.empty(value.shape, dtype=value.dtype, device="cpu",
                                  pin_memory=value.is_cuda and torch.cuda.is_available())
                self._buffers[key] = buf
            buf.copy_(value.detach(), non_blocking=value.is_cuda)
            return buf
        if isinstance(value, dict):
            return {k: self.stage(v, path + (k,)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            staged = [self.stage(v, path + (i,)) for i, v in enumerate(value)]
            return type(value)(staged) if isinstance(value, tuple) else staged
        return copy.deepcopy(value)


class StaleRunError(RuntimeError):
    """A newer run of the job uses the checkpoint directory: this run must not write there, and
    should stop (the cluster ends it anyway)."""


class Checkpointer:
    def __init__(self, ctx: Context, every_steps: int = 0, every_seconds: float = 0, keep: int = 2,
                 directory: str | os.PathLike | None = None, async_save: bool = True, write_threads: int = 4):
        if keep < 2:
            raise ValueError("keep at least 2 checkpoints, so that a bad newest one has a fallback")
        self.ctx = ctx
        self.run = ctx.restart_count
        self.dir = Path(directory or ctx.checkpoint_dir)
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.keep = keep
        self.async_save = async_save
        self.write_threads = write_threads
        self._staging = _Staging()
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None
        self._warned = False
        # the background writer's collectives go on a group of their own, beside the training's
        self._group = dist.new_group(backend="gloo") if ctx.world_size > 1 and async_save else None
        atexit.register(self.wait)
        self._last_save = time.monotonic()
        self.last_step = 0
        self.last_time = 0.0   # wall time of the newest checkpoint written or restored
        if ctx.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            _register(self.dir / RUNS, self.run)
            if ctx.ledger is not None:
                ctx.ledger.keep_progress(self.dir / RUNS)
            newer = self.newest_run()
            if newer > self.run:
                log.warning("checkpoint directory %s already belongs to run %d; this is run %d (stale): "
                            "its checkpoints will be refused", self.dir, newer, self.run)
        ctx.barrier()

    # ------------------------------------------------------------ what goes in

    def _models(self, state: dict):
        return [v for v in state.values() if isinstance(v, torch.nn.Module)]

    def _to_save(self, state: dict, step: int) -> dict:
        models = self._models(state)
        out: dict = {"step": step, f"rank{self.ctx.rank}": {"rng": _rng_state()}}
        for name, value in state.items():
            if isinstance(value, torch.nn.Module):
                out[name] = get_model_state_dict(value)
            elif isinstance(value, torch.optim.Optimizer):
                out[name] = get_optimizer_state_dict(models[0], value)
            elif isinstance(value, PER_RANK):
                out[f"rank{self.ctx.rank}"][name] = value.state_dict()
            elif hasattr(value, "state_dict"):
                out[name] = value.state_dict()
            else:
                out[name] = value
        return out

    def _apply(self, state: dict, loaded: dict) -> None:
        models = self._models(state)
        mine = loaded[f"rank{self.ctx.rank}"]
        for name, value in state.items():
            if isinstance(value, torch.nn.Module):
                set_model_state_dict(value, loaded[name])
            elif isinstance(value, torch.optim.Optimizer):
                set_optimizer_state_dict(models[0], value, loaded[name])
            elif isinstance(value, PER_RANK):
                value.load_state_dict(mine[name])
            elif hasattr(value, "load_state_dict"):
                value.load_state_dict(loaded[name])
            else:
                state[name] = loaded[name]
        _set_rng_state(mine["rng"])

    # ------------------------------------------------------------ save

    def maybe_save(self, step: int, state: dict) -> bool:
        due = (self.every_steps and step % self.every_steps == 0) or \
              (self.every_seconds and time.monotonic() - self._last_save >= self.every_seconds)
        if self.ctx.world_size > 1 and self.every_seconds:  # every rank must agree to save
            flag = torch.tensor([1 if due else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            due = bool(flag.item())
        if due:
            self.save(step, state)
        return bool(due)

    def save(self, step: int, state: dict, blocking: bool | None = None) -> Path:
        """Checkpoint `state` at `step` (a collective: every rank calls it). Asynchronous unless
        `blocking` (or the Checkpointer was made with async_save=False): the call returns once the
        state is staged, and the checkpoint counts once the background write has finished."""
        began = time.monotonic()
        try:
            return self._save(step, state, blocking)
        finally:   # the time the loop waited: staging, a write in flight before, a blocking write
            if self.ctx.ledger is not None:
                self.ctx.ledger.blocked(time.monotonic() - began)

    def _save(self, step: int, state: dict, blocking: bool | None) -> Path:
        blocking = not self.async_save if blocking is None else blocking
        self.wait()
        path = self.dir / f"step-{step:09d}-run{self.run}"
        newer = self.newest_run() if self.ctx.is_main else 0
        if self.ctx.is_main and newer <= self.run and path.exists():
            shutil.rmtree(path)   # an earlier, interrupted attempt of this run at the same step
        if self._max(int(newer > self.run), None):   # every rank agrees, and none writes
            raise self._stale(step, newer)
        staged = self._staging.stage(self._to_save(state, step))
        if any(t.is_cuda for t in self._models_tensors(state)):
            torch.cuda.synchronize()   # the non-blocking copies into pinned memory have landed
        self._last_save = time.monotonic()
        if blocking or not self.async_save:
            self._write(staged, path, step, self._group if self.async_save else None)
        else:
            self._writer = threading.Thread(target=self._write_in_background, args=(staged, path, step),
                                            name="checkpoint-writer", daemon=True)
            self._writer.start()
        return path

    @staticmethod
    def _models_tensors(state: dict):
        for value in state.values():
            if isinstance(value, torch.nn.Module):
                yield from value.parameters()

    def _write(self, staged: dict, path: Path, step: int, group) -> None:
        writer = dcp.FileSystemWriter(str(path), thread_count=self.write_threads)
        if self.ctx.world_size > 1:
            dcp.save(staged, storage_writer=writer, process_group=group)
            dist.barrier(group=group)        # every rank's part is on disk
        else:
            dcp.save(staged, storage_writer=writer)
        newer, failure = 0, None
        if self.ctx.is_main:
            try:
                newer = self.newest_run()
                if newer <= self.run:        # the last look before the checkpoint counts
                    _write_marker(path, step, self.run)
                    self._prune()
            except Exception as e:           # every rank learns of it below, so that none waits
                failure = e
        # the outcome on every rank (in place of a barrier): 0 complete, 1 refused, 2 failed
        outcome = self._max(2 if failure else 1 if newer > self.run else 0, group)
        if outcome == 2:
            raise failure or RuntimeError(f"rank 0 could not complete the checkpoint of step {step}")
        if outcome == 1:
            raise self._stale(step, newer)
        self.last_step = step
        self.last_time = time.time()

    def _max(self, value: int, group) -> int:
        """The largest of the ranks' `value`s, on every rank (one all-reduce when distributed)."""
        if self.ctx.world_size == 1:
            return value
        cuda = dist.get_backend(group) == "nccl"
        t = torch.tensor([value], device=self.ctx.device if cuda else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return int(t.item())

    def _stale(self, step: int, newer: int) -> StaleRunError:
        which = f"run {newer}" if newer > self.run else "a newer run"
        message = f"run {self.run} is stale: {which} uses {self.dir}; the checkpoint of step {step} is refused"
        if self.ctx.is_main and not self._warned:
            log.warning("%s; this run should stop", message)
            self._warned = True
        if self.ctx.stop is not None:
            self.ctx.stop.request("Superseded")
        return StaleRunError(message)

    def newest_run(self) -> int:
        """The newest run known in the checkpoint directory: registered in runs/, or with a
        checkpoint folder there."""
        runs = [self.run]
        try:
            runs += [int(m.group(1)) for name in os.listdir(self.dir / RUNS) if (m := RUN_FILE.match(name))]
        except FileNotFoundError:
            pass
        runs += [run for run, _, _ in self._checkpoints()]
        return max(runs)

    def _write_in_background(self, staged: dict, path: Path, step: int) -> None:
        try:
            self._write(staged, path, step, self._group)
        except BaseException as e:   # raised again in the training thread at the next save or wait
            self._error = e

    def wait(self) -> None:
        """Until the save in flight, if any, is complete."""
        writer = self._writer
        if writer is not None:
            writer.join()
            self._writer = None
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, StaleRunError):
                raise error
            raise RuntimeError(f"the background checkpoint write failed: {error}") from error

    def _prune(self) -> None:
        """Delete all but the newest `keep` complete checkpoints, and incomplete ones older than the
        newest complete one; never a checkpoint of a run newer than this one."""
        found = self._checkpoints()
        complete = [(run, step, p) for run, step, p in found if (p / MARKER).exists()]
        if not complete:
            return
        kept = {p for _, _, p in complete[:self.keep]}
        newest = complete[0][:2]
        for run, step, p in found:
            if run > self.run or p in kept:
                continue
            if (p / MARKER).exists() or (run, step) < newest:
                shutil.rmtree(p, ignore_errors=True)

    # ------------------------------------------------------------ restore

    def _checkpoints(self) -> list[tuple[int, int, Path]]:
        """(run, step, folder), newest run first and, within a run, highest step first."""
        if not self.dir.is_dir():
            return []
        found = [(int(m.group(2) or 0), int(m.group(1)), p) for p in self.dir.iterdir()
                 if (m := STEP_DIR.match(p.name)) and p.is_dir()]
        return sorted(found, key=lambda f: (f[0], f[1]), reverse=True)

    def _choose(self) -> str:
        for _, _, path in self._checkpoints():
            if not (path / MARKER).exists():
                log.warning("checkpoint %s is incomplete (no %s); skipping it", path, MARKER)
                continue
            try:
                dcp.FileSystemReader(str(path)).read_metadata()
            except Exception as e:  # truncated or damaged metadata
                log.warning("checkpoint %s cannot be read (%s); skipping it", path, e)
                continue
            return str(path)
        return ""

    def restore(self, state: dict) -> int:
        """Load the newest complete checkpoint into `state`; return its step, or 0 when there is none."""
        began = time.monotonic()
        step = self._restore(state)
        if self.ctx.ledger is not None:   # (rank 0 also works out what the run before lost)
            self.ctx.ledger.restored(step, time.monotonic() - began, self.dir / RUNS if self.ctx.is_main else None)
        return step

    def _restore(self, state: dict) -> int:
        self.wait()
        choice = [self._choose() if self.ctx.is_main else ""]
        if self.ctx.world_size > 1:
            dist.broadcast_object_list(choice, src=0)   # every rank loads the same one
        if not choice[0]:
            return 0
        loaded = self._to_save(state, 0)
        dcp.load(loaded, checkpoint_id=choice[0])
        self._apply(state, loaded)
        self.last_step = int(loaded["step"])
        try:
            self.last_time = os.stat(os.path.join(choice[0], MARKER)).st_mtime
        except OSError:
            self.last_time = time.time()
        log.info("resumed from %s (step %d)", choice[0], self.last_step)
        return self.last_step


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_marker(path: Path, step: int, run: int) -> None:
    tmp = path / f".{MARKER}.tmp"
    with open(tmp, "w") as f:
        f.write(f"step {step}\nrun {run}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / MARKER)
    _fsync_dir(path)


def _register(runs: Path, run: int) -> None:
    """Record in `runs` that run `run` has started: a file run-N, made at once (O_EXCL); already
    there when the same run made a Checkpointer before."""
    runs.mkdir(exist_ok=True)
    try:
        fd = os.open(runs / f"run-{run}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    try:
        os.write(fd, f"pid {os.getpid()} host {socket.gethostname()} time {time.time():.0f}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(runs)
