"""A small real training run: every rank of the step fits a shared linear model with DDP (gloo).

Started by `airrun`, which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every rank.
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    true_w = torch.tensor([[2.0], [-3.0], [0.5]])
    model = DistributedDataParallel(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, 201):
        x = torch.randn(64, 3, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w + 1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 50 == 0:
            print(f"step {step:3d} loss {loss.item():.5f} ({world} ranks)", flush=True)
    if rank == 0:
        w = model.module.weight.detach().flatten().tolist()
        print("learned weights " + " ".join(f"{v:.3f}" for v in w) + f" (job {os.environ.get('AIR_JOB_ID')})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
