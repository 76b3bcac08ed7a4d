r"""A model larger than a toy: an MLP 784 -> 2048 -> 2048 -> 10, 5.8M parameters (23 MB).

The shape of an MNIST MLP, on synthetic data (MNIST does not download here): 784
inputs that are a noisy image of 16 hidden factors, labelled by those factors, so it
learns quickly (60% test accuracy in about 10 steps, 70% in about 20). Its parameters are
three times what the controller's store could carry in one value (8 MiB), which is
why it is here: nothing the size of the model travels through the store. The first
rank evaluates it in place and posts the metric; look-back copies stay in that rank
(docs/running.md, "Evaluation on gloo"). From the repository root:

    # 2 gloo processes, failure-free, to 70% test accuracy (a few dozen steps).
    .venv/bin/trainthrough run --engine gloo --paradigm dp --ranks 2 \
        --workload examples/wide_mlp.py:build --out runs/wide-mlp
"""

import torch
import torch.nn as nn

from trainthrough.workloads.base import OptimizerSpec
from trainthrough.workloads.custom import TorchWorkload


def build(seed: int, hidden: int = 2048, samples: int = 2048,
          target: float = 0.7) -> TorchWorkload:
    """The workload; ``hidden`` sets both hidden layers' width (2048: 5.8M parameters)."""
    g = torch.Generator().manual_seed(1234)  # the data is fixed; the seed drives training
    factors = torch.randn(samples + 512, 16, generator=g)
    x = factors @ torch.randn(16, 784, generator=g) / 4 + 0.5 * torch.randn(
        samples + 512, 784, generator=g)
    y = (factors @ torch.randn(16, 10, generator=g)).argmax(1)
    train, test = (x[:samples], y[:samples]), (x[samples:], y[samples:])
    model = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                          nn.ReLU(), nn.Linear(hidden, 10))
    return TorchWorkload(model, train=train, test=test, name="wide-mlp", target=target,
                         optimizer=OptimizerSpec(kind="adam", lr=1e-3), batch_size=32,
                         seed=seed, eval_every=10, max_iterations=400)
