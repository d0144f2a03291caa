"""What the runtime costs a training step: the same tinygpt loop with and without it.

    python bench/bench_runtime.py [--steps 300] [--write bench/RESULTS.md]

One process on the CPU. "With" adds what a script on the runtime does every step: ctx.report (the
progress file the node daemon reads), ctx.stop.requested() and ckpt.maybe_save with no save due.
Both loops run alternately in rounds; the best round of each is compared. Target: under 1%.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "tinygpt"))

from air import runtime  # noqa: E402
from harness import report, table  # noqa: E402
import torch  # noqa: E402
from data import CharDataset  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def loop(steps: int, with_runtime: bool, work: str) -> float:
    torch.manual_seed(0)
    data = CharDataset(64)
    model = GPT(GPTConfig(vocab=data.vocab, block=64, layers=2, heads=4, width=128))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = runtime.ResumableSampler(len(data))
    batches = iter(sampler)
    if with_runtime:
        os.environ["AIR_PROGRESS_DIR"] = work
        ctx = runtime.init(checkpoint_dir=os.path.join(work, "ckpt"))
        ckpt = runtime.Checkpointer(ctx, every_steps=10**9)
        state = {"model": model, "optim": optim, "sampler": sampler}
    began = time.perf_counter()
    for step in range(1, steps + 1):
        idx = [next(batches) for _ in range(8)]
        x = torch.stack([data[i][0] for i in idx])
        y = torch.stack([data[i][1] for i in idx])
        _, loss = model(x, y)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        if with_runtime:
            ctx.report(step, loss=loss.item(), tokens=x.numel())
            if ctx.stop.requested():
                break
            ckpt.maybe_save(step, state)
    return (time.perf_counter() - began) / steps


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="air-bench-runtime-")
    plain, ours = [], []
    for _ in range(args.rounds):
        plain.append(loop(args.steps, False, work))
        ours.append(loop(args.steps, True, work))
    p, o = min(plain), min(ours)
    row = ("tinygpt step, 2 layers x 128, batch 8 x 64, 1 thread", f"{p * 1000:.2f} ms", f"{o * 1000:.2f} ms",
           f"{(o - p) / p * 100:+.2f}%")
    report("runtime overhead per step",
           table(["loop", "plain", "with the runtime", "overhead (target < 1%)"], [row]), args.write,
           f"best of {args.rounds} rounds of {args.steps} steps each, alternating")
    return 0


if __name__ == "__main__":
    sys.exit(main())
