"""The text tinygpt learns: generated, so the repo ships no data file. A seeded random grammar of
English-like sentences, encoded as characters; the same seed gives the same text everywhere."""
from __future__ import annotations

import random

import torch

SUBJECTS = ["the cluster", "a node", "the scheduler", "every rank", "the job", "a researcher", "the GPU"]
VERBS = ["starts", "checkpoints", "resumes", "waits for", "preempts", "trains", "reports", "drains"]
OBJECTS = ["the model", "its batch", "a reservation", "the queue", "the last step", "eight GPUs", "the loss"]
ENDINGS = [".", " again.", " at once.", " before dawn.", " without losing work."]


def text(sentences: int = 20000, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}"
                    for _ in range(sentences))


class CharDataset(torch.utils.data.Dataset):
    """Windows of `block + 1` characters: input and target shifted by one."""

    def __init__(self, block: int, sentences: int = 20000, seed: int = 0):
        corpus = text(sentences, seed)
        self.chars = sorted(set(corpus))
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.data = torch.tensor([self.index[c] for c in corpus], dtype=torch.long)
        self.block = block

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return len(self.data) - self.block - 1

    def __getitem__(self, i: int):
        chunk = self.data[i:i + self.block + 1]
        return chunk[:-1], chunk[1:]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)
