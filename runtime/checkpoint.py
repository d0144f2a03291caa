"""Checkpoints through torch.distributed.checkpoint: each rank writes its own part, and a checkpoint
counts only once it is complete.

Layout: CHECKPOINT_DIR/step-000120/ holds DCP's files; rank 0 writes COMPLETE there last (written
aside, fsynced, then renamed), after every rank has finished. Restore takes the newest directory
that has COMPLETE and whose metadata reads back; a newer one without it (interrupted mid-write)
or with unreadable metadata is skipped with a warning. The newest `keep` complete checkpoints stay.

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
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from runtime.context import Context
from runtime.data import ResumableSampler

log = logging.getLogger("air.runtime")
# DCP warns on every save without a process group; a single-rank job is meant to save that way.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")
STEP_DIR = re.compile(r"^step-(\d+)$")
MARKER = "COMPLETE"
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


class Checkpointer:
    def __init__(self, ctx: Context, every_steps: int = 0, every_seconds: float = 0, keep: int = 2,
                 directory: str | os.PathLike | None = None, async_save: bool = True, write_threads: int = 4):
        if keep < 2:
            raise ValueError("keep at least 2 checkpoints, so that a bad newest one has a fallback")
        self.ctx = ctx
        self.dir = Path(directory or ctx.checkpoint_dir)
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.keep = keep
        self.async_save = async_save
        self.write_threads = write_threads
        self._staging = _Staging()
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None
        # the background writer's collectives go on a group of their own, beside the training's
        self._group = dist.new_group(backend="gloo") if ctx.world_size > 1 and async_save else None
        atexit.register(self.wait)
        self._last_save = time.monotonic()
        self.last_step = 0
        self.last_time = 0.0   # wall time of the newest checkpoint written or restored
        if ctx.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
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
        blocking = not self.async_save if blocking is None else blocking
        self.wait()
        path = self.dir / f"step-{step:09d}"
        if self.ctx.is_main and path.exists():
            shutil.rmtree(path)   # an earlier, interrupted attempt at the same step
        self.ctx.barrier()
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
        if self.ctx.is_main:
            _write_marker(path, step)
            self._prune()
        if self.ctx.world_size > 1:
            dist.barrier(group=group)
        self.last_step = step
        self.last_time = time.time()

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
            raise RuntimeError(f"the background checkpoint write failed: {error}") from error

    def _prune(self) -> None:
        complete = [p for _, p in self._checkpoints() if (p / MARKER).exists()]
        for old in complete[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)
        newest = complete[0] if complete else None
        for _, p in self._checkpoints():   # incomplete ones older than the newest complete one
            if newest is not None and not (p / MARKER).exists() and p.name < newest.name:
                shutil.rmtree(p, ignore_errors=True)

    # ------------------------------------------------------------ restore

    def _checkpoints(self) -> list[tuple[int, Path]]:
        if not self.dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.dir.iterdir() if (m := STEP_DIR.match(p.name))]
        return sorted(found, reverse=True)

    def _choose(self) -> str:
        for step, path in self._checkpoints():
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


def _write_marker(path: Path, step: int) -> None:
    tmp = path / f".{MARKER}.tmp"
    with open(tmp, "w") as f:
        f.write(f"step {step}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / MARKER)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
