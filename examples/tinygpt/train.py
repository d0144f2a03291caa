"""Train tinygpt on the AIR runtime: resumable, bit for bit.

    airrun python train.py [--steps 300] [--every 25] [--layers 4 --width 256 ...]

Every rank logs the dataset indices of each step to LOG.rank<R> (when --log is given), and rank 0
writes the final parameters to --out; the tests compare both with an uninterrupted run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from air import runtime  # first: from here on a stop signal is caught, not fatal

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import CharDataset  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=25, help="checkpoint every N steps")
    p.add_argument("--every-seconds", type=float, default=0.0)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--log", default="", help="per-rank log of the indices each step used")
    p.add_argument("--out", default="", help="final parameters (rank 0)")
    p.add_argument("--sleep", type=float, default=0.0, help="extra seconds per step (to be caught mid-run)")
    args = p.parse_args()

    ctx = runtime.init(checkpoint_dir=args.checkpoint_dir)
    data = CharDataset(args.block, seed=args.seed)
    torch.manual_seed(args.seed)          # the same initial weights on every rank
    model = GPT(GPTConfig(vocab=data.vocab, block=args.block, layers=args.layers, heads=args.heads,
                          width=args.width)).to(ctx.device)
    n_params = model.parameters_count()
    ctx.reporter.flops_per_token = runtime.transformer_flops_per_token(n_params, args.layers, args.width, args.block)
    runtime.broadcast_parameters(model)
    torch.manual_seed(args.seed * 1000 + 1 + ctx.rank)   # per-rank dropout
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sampler = runtime.ResumableSampler(len(data), seed=args.seed, rank=ctx.rank, world_size=ctx.world_size)
    ckpt = runtime.Checkpointer(ctx, every_steps=args.every, every_seconds=args.every_seconds)
    state = {"model": model, "optim": optim, "sampler": sampler}
    start = ckpt.restore(state)
    if ctx.is_main:
        print(f"tinygpt: {n_params:,} parameters, {ctx.world_size} ranks on {ctx.device}, "
              f"restart {ctx.restart_count}, from step {start}", flush=True)
    log = open(f"{args.log}.rank{ctx.rank}", "a") if args.log else None
    batches = iter(sampler)
    loss = None   # a run resumed at the last step trains no further
    for step in range(start + 1, args.steps + 1):
        idx = []
        while len(idx) < args.batch:
            try:
                idx.append(next(batches))
            except StopIteration:
                batches = iter(sampler)
        x = torch.stack([data[i][0] for i in idx]).to(ctx.device)
        y = torch.stack([data[i][1] for i in idx]).to(ctx.device)
        _, loss = model(x, y)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        runtime.average_gradients(model)   # data parallel, in the same arithmetic every run (not DDP)
        optim.step()
        if args.sleep:
            time.sleep(args.sleep)
        if log is not None:
            log.write(f"{step} {','.join(map(str, idx))}\n")
            log.flush()
        ctx.report(step, loss=loss.item(), tokens=x.numel(), samples=len(idx), checkpoint_step=ckpt.last_step,
                   checkpoint_time=ckpt.last_time)
        if ctx.is_main and step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if ctx.stop.requested():          # every rank agrees on this step
            ckpt.save(step, state, blocking=True)
            if ctx.is_main:
                print(f"stopping at step {step} ({ctx.stop.reason}); checkpoint written", flush=True)
            ctx.stop.exit()
        ckpt.maybe_save(step, state)
    if ctx.is_main:
        if args.out:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
        sample = model(torch.tensor([[data.index["t"]]], device=ctx.device))[0][0, -1].argmax().item()
        final = f"final loss {loss.item():.4f}; " if loss is not None else ""
        print(f"done: {args.steps} steps, {final}after 't' it predicts {data.decode([sample])!r}", flush=True)


if __name__ == "__main__":
    main()
