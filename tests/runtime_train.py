"""A small training run on the AIR runtime, for tests: dropout, AdamW, a resumable sampler.

    python runtime_train.py --dir CKPT --out OUT --steps 20 --every 5 [--crash-at K | --stop-at K]

Each rank appends "step idx,idx,..." lines to OUT.rank<R>.log; rank 0 writes the final
parameters to OUT.pt. --crash-at ends the process abruptly (no checkpoint) at that step;
--stop-at asks the runtime to stop, as SIGTERM would, which checkpoints at that step.
"""
import argparse
import os
import time

import torch

from air import runtime


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--crash-at", type=int, default=0)
    p.add_argument("--stop-at", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step, to be caught mid-run")
    p.add_argument("--async-save", action="store_true", help="periodic saves in the background")
    args = p.parse_args()

    ctx = runtime.init(checkpoint_dir=args.dir)
    torch.manual_seed(1234 + ctx.rank)
    data = torch.randn(256, 8, generator=torch.Generator().manual_seed(7))
    target = data @ torch.randn(8, 1, generator=torch.Generator().manual_seed(8))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    torch.manual_seed(42)  # the same initial weights on every rank
    for layer in (model[0], model[2]):
        layer.reset_parameters()
    torch.manual_seed(1234 + ctx.rank)
    if ctx.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    sampler = runtime.ResumableSampler(len(data), seed=3, rank=ctx.rank, world_size=ctx.world_size)
    ckpt = runtime.Checkpointer(ctx, every_steps=args.every, keep=2, async_save=args.async_save)
    state = {"model": model, "optim": optim, "sampler": sampler}
    start = ckpt.restore(state)
    batches = iter(sampler)
    log = open(f"{args.out}.rank{ctx.rank}.log", "a")
    for step in range(start + 1, args.steps + 1):
        idx = []
        for _ in range(16):
            try:
                idx.append(next(batches))
            except StopIteration:
                batches = iter(sampler)
                idx.append(next(batches))
        loss = torch.nn.functional.mse_loss(model(data[idx]), target[idx])
        optim.zero_grad()
        loss.backward()
        optim.step()
        if args.sleep:
            time.sleep(args.sleep)
        log.write(f"{step} {','.join(map(str, idx))}\n")
        log.flush()
        if step == args.crash_at:
            os._exit(9)
        if step == args.stop_at:
            ctx.stop.request("test")
        if ctx.stop.requested():
            ckpt.save(step, state, blocking=True)
            return
        ckpt.maybe_save(step, state)
    if ctx.is_main:
        inner = model.module if hasattr(model, "module") else model
        torch.save({k: v.clone() for k, v in inner.state_dict().items()}, f"{args.out}.pt")


if __name__ == "__main__":
    main()
