"""A tiny least-squares model trained by full-batch gradient descent (tests only).

Its test set is its training set, so the metric (the mean squared error) falls
monotonically: the case in which evaluating every ``eval_every`` iterations must
still find the exact iteration the target is reached (engines/evaluation.py).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainthrough.workloads.base import OptimizerSpec
from trainthrough.workloads.custom import TorchWorkload


def build(seed: int, target: float = 0.05) -> TorchWorkload:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.randn(4, 1, generator=g) + 0.1 * torch.randn(64, 1, generator=g)
    return TorchWorkload(nn.Linear(4, 1), train=(x, y), test=(x, y), loss_fn=F.mse_loss,
                         metric="loss", target=target, seed=seed, batch_size=32,
                         optimizer=OptimizerSpec(kind="sgd", lr=0.05), name="gd",
                         eval_every=10, max_iterations=400)
