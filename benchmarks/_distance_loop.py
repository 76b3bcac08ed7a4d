"""The loop benchmarks/distance.py runs: a 1M-parameter MLP, so a step's allreduce moves
~4 MB (what a bandwidth limit can be felt on). Rank 0 returns when each step ended."""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainthrough.loop import Loop, training_loop

WIDTH, BATCH, RANKS = 1024, 16, 3


@training_loop
def train(loop: Loop) -> dict[str, object]:
    steps = int(os.environ.get("TT_DISTANCE_STEPS", "40"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * BATCH * RANKS, WIDTH, generator=g)
    y = torch.randint(0, 10, (len(x),), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loop.attach(model, opt, DataLoader(TensorDataset(x, y), batch_size=BATCH))
    ends: list[float] = []
    while loop.running(epochs=1):
        loop.step(lambda b: F.cross_entropy(model(b[0]), b[1]))
        ends.append(time.time())
    return {"ends": ends, "params": sum(p.numel() for p in model.parameters())}
