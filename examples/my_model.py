"""Your own model as a trainthrough workload, given by reference.

    .venv/bin/trainthrough run --workload examples/my_model.py:build \
        --fail "shards=1@iter=20" --baseline

The factory takes the run's ``seed`` (and any ``--option key=value`` as keyword
arguments, typed by its signature) and returns a workload. ``TorchWorkload`` wraps an
ordinary PyTorch model, data and loss; trainthrough shards its parameters over the
parameter server (or replicates them over data-parallel ranks) and keeps training
through the failures you ask for. Every process of a run (Ray actors, gloo ranks)
imports this file by the same reference.
"""

import torch
import torch.nn as nn

from trainthrough.workloads.custom import TorchWorkload


def build(seed: int, hidden: int = 16) -> TorchWorkload:
    g = torch.Generator().manual_seed(1234)  # the data is fixed; the seed drives training
    x = torch.randn(512, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(1)
    train, test = (x[:400], y[:400]), (x[400:], y[400:])
    model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))
    return TorchWorkload(model, train=train, test=test, name="my-model", target=0.85,
                         seed=seed, eval_every=5, max_iterations=600)
