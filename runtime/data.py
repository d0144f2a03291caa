"""A sampler whose position is part of the checkpoint, so a resumed run sees exactly the batches
it would have seen. (torchdata's StatefulDataLoader does this for whole loaders; this small sampler
covers index-based datasets without another dependency.)"""
from __future__ import annotations

import torch


class ResumableSampler(torch.utils.data.Sampler):
    """Each epoch a seeded permutation of range(size), split across ranks; remembers how far it got."""

    def __init__(self, size: int, seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True):
        self.size, self.seed, self.rank, self.world_size, self.shuffle = size, seed, rank, world_size, shuffle
        self.epoch = 0
        self.position = 0   # indices of this epoch already handed out on this rank

    def _order(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=g).tolist()
        else:
            order = list(range(self.size))
        return order[self.rank::self.world_size]

    def __iter__(self):
        order = self._order()
        while self.position < len(order):
            index = order[self.position]
            self.position += 1
            yield index
        self.epoch += 1
        self.position = 0

    def __len__(self) -> int:
        return len(self._order())

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
