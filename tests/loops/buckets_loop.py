"""A small user's loop whose gradient goes in several buckets (for the tests).

An MLP of about 3,000 parameters with dropout, AdamW, one micro-batch per rank: on two
ranks each gradient element is the sum of two values, which gloo adds in either order
to the same bits, and a survivor that redoes a step alone adds its two micro-batches
to the same bits too, so runs with any bucket count, with or without a rollback, end
with the same parameters. Returns their hash (and the gradient's size).
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainthrough.loop import Loop, training_loop


@training_loop(eval_every=10**6, checkpoint_every=10**6)
def train(loop: Loop) -> dict[str, object]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 64), nn.Tanh(), nn.Dropout(0.1), nn.Linear(64, 32),
                          nn.Tanh(), nn.Linear(32, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16 * 16, 12, generator=g)
    y = (x[:, 0] > x[:, 1]).long() + (x[:, 2] > 0).long()

    def loss_of(batch: list[torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        return F.cross_entropy(model(xb), yb)

    loop.attach(model, opt, DataLoader(TensorDataset(x, y), batch_size=16))
    while loop.running(epochs=1):
        loop.step(loss_of)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return {"sha": h.hexdigest(), "steps": loop.step_index,
            "numel": sum(p.numel() for p in model.parameters())}
