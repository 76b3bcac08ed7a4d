"""Your own PyTorch training loop, data parallel, surviving a rank killed mid-run.

Read it top to bottom: a dataset, a model with BatchNorm, an optimizer and a
DataLoader, all plain PyTorch; the lines marked ``# +`` are all trainthrough adds.
Run it (CPU, about a minute; one Ray cluster started and stopped for you):

    .venv/bin/python examples/byo_loop.py               # 4 ranks on local Ray, rank 1 killed
    .venv/bin/python examples/byo_loop.py --engine gloo # the same on local processes

It trains twice, with the same seed: once without failures, once with rank 1
SIGKILLed at its 40th step and recovered by mini-batch rollback (the step is redone
by the 3 survivors, a replacement joins 2 s later with a live rank's state), then
prints what happened and both accuracies.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainthrough.errors import UserError
from trainthrough.loop import Loop, launch, training_loop  # +


def blobs(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian classes in 16 dimensions."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(1234)) * 1.2
    y = torch.randint(0, 4, (n,), generator=g)
    x = centers[y] + torch.randn(n, 16, generator=g) * 1.5
    return TensorDataset(x, y)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(),
                                  nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def accuracy(model: nn.Module, data: TensorDataset) -> float:
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        acc = float((model(x).argmax(1) == y).float().mean())
    model.train()
    return acc


@training_loop(metric="accuracy", direction="max")  # +
def train(loop: Loop) -> dict[str, float]:
    torch.manual_seed(0)  # every rank builds the same initial model
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(blobs(6000, seed=0), batch_size=32)
    test = blobs(2000, seed=1)

    def loss_of(batch: list[torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    loop.attach(model, opt, loader, evaluate=lambda: accuracy(model, test))  # +
    while loop.running(epochs=2):  # +  (instead of: for epoch ...: for batch in loader:)
        loop.step(loss_of)  # +  (instead of: zero_grad, backward, step)
    return {"accuracy": accuracy(model, test)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", default="ray", choices=("ray", "gloo"))
    p.add_argument("--ray-address", default=None, help="join this Ray cluster")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--out", default=None, help="folder of the two runs (replaced if there)")
    a = p.parse_args()
    out = a.out or f"runs/byo-loop-{a.engine}"
    common = dict(ranks=a.ranks, engine=a.engine, ray_address=a.ray_address, seed=0,
                  overwrite=True)
    try:
        clean = launch(train, out=f"{out}/no-failure", progress=False, **common)  # +
        hit = launch(train, out=f"{out}/rank1-killed", strategy="rollback",  # +
                     fail=["rank=1@iter=40"], recovery_delay=2.0, **common)
    except UserError as e:  # a bad argument: one line, exit 2
        print(f"byo_loop: {e}", file=sys.stderr)
        return 2
    print(hit)
    gap = 100 * (clean.returned["accuracy"] - hit.returned["accuracy"])
    print(f"accuracy without failures {clean.returned['accuracy']:.4f}, "
          f"with rank 1 killed {hit.returned['accuracy']:.4f} ({gap:+.2f} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
