"""Progress reports: what a training loop says about itself (step, loss, throughput, MFU), written
where the node daemon reads it, which is also the heartbeat that hang detection watches.

Every rank writes its own file under $AIR_PROGRESS_DIR (set by airnoded) on each report, aside then
renamed; rank 0's file carries the job's numbers. Throughput is over the interval since the last
report; MFU needs the model's FLOPs per token (transformer_flops_per_token) and the GPU's peak.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

# Dense bf16 peak FLOP/s per GPU (no sparsity), by the name NVML reports.
PEAK_BF16 = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "B200": 2250e12}


def transformer_flops_per_token(params: int, layers: int = 0, width: int = 0, context: int = 0) -> float:
    """Training FLOPs per token: 6N for the weights plus 12·layers·width·context for attention."""
    return 6.0 * params + 12.0 * layers * width * context


def peak_flops(device_name: str) -> float:
    """The peak for a GPU name such as "NVIDIA H100 80GB HBM3" ($AIR_PEAK_FLOPS overrides); 0 if unknown."""
    override = os.environ.get("AIR_PEAK_FLOPS", "")
    if override:
        return float(override)
    for key, value in PEAK_BF16.items():
        if key in device_name:
            return value
    return 0.0


class Reporter:
    """Reports are cheap to make; the file is rewritten at most every `write_every_s` (the node daemon
    reads it once a heartbeat), so reporting every step costs the loop next to nothing."""

    def __init__(self, rank: int, world_size: int, flops_per_token: float = 0.0, peak: float = 0.0,
                 directory: str | None = None, write_every_s: float = 0.5, ledger=None):
        self.rank = rank
        self.world_size = world_size
        self.flops_per_token = flops_per_token
        self.peak = peak
        where = directory if directory is not None else os.environ.get("AIR_PROGRESS_DIR", "")
        self.path = Path(where) / f"rank{rank}.json" if where else None
        self._last: tuple[float, int, int] | None = None   # (time, tokens so far, samples so far)
        self._tokens = 0
        self._samples = 0
        self.latest: dict = {}
        self.write_every_s = write_every_s
        self._written = 0.0
        self._pending: tuple | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.RLock()
        self.ledger = ledger   # runtime.goodput.Ledger: each report marks a step

    def report(self, step: int, loss: float | None = None, tokens: int = 0, samples: int = 0,
               checkpoint_step: int | None = None, **metrics) -> dict:
        """`tokens` and `samples`: what this rank processed since its last report."""
        with self._lock:
            if self.ledger is not None:
                self.ledger.stepped(step)
            now = time.time()
            self._tokens += tokens
            self._samples += samples
            if now - self._written < self.write_every_s and self._last is not None:
                # written later: by the next report, or by the timer if the loop goes quiet
                self._pending = (step, loss, checkpoint_step, metrics)
                if self._timer is None:
                    self._timer = threading.Timer(self.write_every_s, self._flush)
                    self._timer.daemon = True
                    self._timer.start()
                return self.latest
            return self._make(step, loss, checkpoint_step, metrics, now)

    def _flush(self) -> None:
        with self._lock:
            self._timer = None
            if self._pending is not None:
                self._make(*self._pending, time.time())

    def _make(self, step: int, loss, checkpoint_step, metrics: dict, now: float) -> dict:
        self._pending = None
        out = {"step": step, "time": now, "rank": self.rank}
        if loss is not None:
            out["loss"] = float(loss)
        if self._last is not None and now > self._last[0]:
            dt = now - self._last[0]
            tok_s = (self._tokens - self._last[1]) / dt * self.world_size
            out["tokens_per_s"] = tok_s
            out["samples_per_s"] = (self._samples - self._last[2]) / dt * self.world_size
            if self.flops_per_token and self.peak:
                out["mfu"] = tok_s * self.flops_per_token / (self.peak * self.world_size)
        self._last = (now, self._tokens, self._samples)
        if checkpoint_step is not None:
            out["checkpoint_step"] = checkpoint_step
        out.update({k: float(v) if isinstance(v, (int, float)) else str(v) for k, v in metrics.items()})
        if self.ledger is not None:
            out["goodput"] = self.ledger.figures()
        self.latest = out
        self._written = now
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            try:
                tmp.write_text(json.dumps(out))
                os.replace(tmp, self.path)
            except OSError:
                pass   # progress is best effort: never the reason a training run fails
        return out
