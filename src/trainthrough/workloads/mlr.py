"""Multinomial logistic regression by mini-batch SGD on scikit-learn's digits, or on
MNIST / Fashion-MNIST given their four IDX files (the larger option: 784 features and
60,000 samples instead of 64 and 1,437).

Parameters are a weight matrix with one row per input feature (the parameter-server
"key") and a bias; workers push gradients, the shards run SGD. The metric is the
full training objective (cross-entropy + L2), which is smoother than accuracy and
so gives a well-defined iteration at which the target is first met.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from trainthrough.errors import UserError
from trainthrough.fields import Bounds
from trainthrough.workloads._data import BatchSchedule, check_batches, digits_split, split_rows
from trainthrough.workloads.base import Evaluation, OptimizerSpec, Params, Workload
from trainthrough.workloads.idx import load_idx_pair


@dataclass
class _Part:
    x: torch.Tensor
    y: torch.Tensor
    batches: BatchSchedule


class MLR(Workload):
    name = "mlr"
    description = "multinomial logistic regression, mini-batch SGD, sklearn digits"
    metric_name = "train_loss"
    direction = "min"
    default_target = 0.16
    update_kind = "gradient"
    aggregate = "mean"
    default_optimizer = OptimizerSpec(kind="sgd", lr=0.5)
    default_max_iterations = 3000
    default_eval_every = 5
    default_checkpoint_every = 50
    step_seconds = 0.002
    option_bounds = {"batch_size": Bounds(ge=1), "l2": Bounds(ge=0)}

    def __init__(self, batch_size: int = 32, l2: float = 1e-4, target: float | None = None,
                 train_images: str | None = None, train_labels: str | None = None,
                 test_images: str | None = None, test_labels: str | None = None,
                 seed: int = 0) -> None:
        self.batch_size = batch_size
        self.l2 = l2
        self.seed = seed
        self.files = (train_images, train_labels, test_images, test_labels)
        if any(self.files) and not all(self.files):
            raise UserError("mlr: give all four of train_images, train_labels, "
                            "test_images and test_labels, or none (sklearn digits)")
        if train_images and train_labels and test_images and test_labels:
            x_tr, self.y_train = load_idx_pair(train_images, train_labels)
            x_te, self.y_test = load_idx_pair(test_images, test_labels)
            if x_tr.shape[2:] != x_te.shape[2:]:
                raise UserError(f"{train_images} and {test_images} differ in image size")
            self.x_train, self.x_test = x_tr.flatten(1), x_te.flatten(1)
            # Not calibrated on MNIST itself: softmax regression typically reaches a
            # training loss of ~0.3 on MNIST after a few epochs, so 0.35 is in reach.
            self.default_target = 0.35
        else:
            self.x_train, self.y_train, self.x_test, self.y_test = digits_split()
        if target is not None:
            self.default_target = target
        self.classes = 10 if any(self.files) else int(self.y_train.max()) + 1

    def init_params(self, gen: torch.Generator) -> Params:
        d = self.x_train.shape[1]
        return {
            "W": torch.randn(d, self.classes, generator=gen) * 0.01,
            "b": torch.zeros(self.classes),
        }

    def partition(self, num_workers: int) -> list[Any]:
        n = len(self.y_train)
        check_batches("mlr", n, self.batch_size, num_workers)
        return [
            _Part(self.x_train[s], self.y_train[s],
                  BatchSchedule(s.stop - s.start, self.batch_size, self.seed * 7919 + i))
            for i, s in enumerate(split_rows(n, num_workers))
        ]

    def compute_update(self, params: Params, data: Any, state: Any, step: int,
                       seed: int) -> Params:
        idx = data.batches.indices(step)
        return self._gradient(params, data.x[idx], data.y[idx])

    def sample_count(self) -> int:
        return len(self.y_train)

    def compute_update_on(self, params: Params, indices: torch.Tensor, seed: int) -> Params:
        return self._gradient(params, self.x_train[indices], self.y_train[indices])

    def _gradient(self, params: Params, x: torch.Tensor, y: torch.Tensor) -> Params:
        """Mean cross-entropy gradient over the rows ``x, y``, plus the L2 term."""
        w, b = params["W"], params["b"]
        p = torch.softmax(x @ w + b, dim=1)
        p[torch.arange(len(y)), y] -= 1.0
        p /= len(y)
        return {"W": x.T @ p + self.l2 * w, "b": p.sum(0)}

    def evaluate(self, params: Params) -> Evaluation:
        w, b = params["W"], params["b"]
        loss = F.cross_entropy(self.x_train @ w + b, self.y_train).item()
        loss += 0.5 * self.l2 * float((w * w).sum())
        acc = (torch.argmax(self.x_test @ w + b, 1) == self.y_test).float().mean().item()
        return Evaluation(metric=loss, loss=loss, extras={"test_accuracy": acc})

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"batch_size": self.batch_size, "l2": self.l2}
        names = ("train_images", "train_labels", "test_images", "test_labels")
        d.update({k: v for k, v in zip(names, self.files, strict=True) if v})
        return d
