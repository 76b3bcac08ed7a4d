"""A small convolutional network trained with Adam on the parameter server.

Two 3x3 convolutions (1->8->16 channels, ReLU), a 2x2 max-pool, and two fully
connected layers (->64, ReLU, ->10). It trains on scikit-learn's bundled 8x8 digits
by default, so it runs offline in seconds, or on 28x28 MNIST / Fashion-MNIST given
their four IDX files. Workers push gradients of the cross-entropy; the shards
average them and run Adam. The metric is test accuracy.

It is a :class:`~trainthrough.workloads.custom.TorchWorkload` with a fixed model and
data, the same path a user's own model takes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainthrough.errors import UserError
from trainthrough.fields import Bounds
from trainthrough.workloads._data import digits_split
from trainthrough.workloads.base import OptimizerSpec
from trainthrough.workloads.custom import TorchWorkload
from trainthrough.workloads.idx import load_idx_pair


class SmallConvNet(nn.Module):
    """conv(1->8) -> conv(8->16) -> maxpool -> fc(->64) -> fc(->classes)."""

    def __init__(self, side: int, classes: int = 10) -> None:
        super().__init__()
        # padding=1 keeps the 8x8 digits at 8x8 through both convolutions.
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * (side // 2) ** 2, 64)
        self.fc2 = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def _load_idx_pair(images: str, labels: str) -> tuple[torch.Tensor, torch.Tensor]:
    # the 2x2 max-pool would leave nothing of a smaller image for the dense layers
    return load_idx_pair(images, labels, square=True, min_side=2, why="the conv net")


class CNN(TorchWorkload):
    description = "2 conv + 2 fully connected layers with Adam, sklearn digits (or IDX files)"
    default_checkpoint_every = 25
    option_bounds = {"batch_size": Bounds(ge=1), "lr": Bounds(gt=0), "test_limit": Bounds(ge=1),
                     "metric": Bounds(choices=("accuracy", "loss"))}

    def __init__(self, batch_size: int = 32, lr: float = 1e-3, target: float | None = None,
                 train_images: str | None = None, train_labels: str | None = None,
                 test_images: str | None = None, test_labels: str | None = None,
                 test_limit: int = 2000, metric: str = "accuracy", seed: int = 0) -> None:
        files = (train_images, train_labels, test_images, test_labels)
        if any(files) and not all(files):
            raise UserError("cnn: give all four of train_images, train_labels, "
                            "test_images and test_labels, or none (sklearn digits)")
        if train_images and train_labels and test_images and test_labels:
            train = _load_idx_pair(train_images, train_labels)
            test = _load_idx_pair(test_images, test_labels)
            # Scoring all 10,000 MNIST test images costs more than the training
            # between two evaluations; an evenly strided subset keeps
            # the metric representative and sweeps fast.
            stride = max(1, -(-len(test[1]) // max(1, test_limit)))
            test = (test[0][::stride], test[1][::stride])
            if train[0].shape[2:] != test[0].shape[2:]:
                raise UserError(f"{train_images} and {test_images} differ in image size")
            # Reachable by this small net on MNIST and on Fashion-MNIST alike.
            default_target, step_seconds, max_iterations = 0.85, 0.01, 3000
        else:
            x_tr, y_tr, x_te, y_te = digits_split()
            train = (x_tr.view(-1, 1, 8, 8), y_tr)
            test = (x_te.view(-1, 1, 8, 8), y_te)
            default_target, step_seconds, max_iterations = 0.95, 0.003, 1500
        if metric == "loss":
            # Test cross-entropy: smooth, so the iteration it is first met is well defined
            # (accuracy is a step function); used where rework is measured.
            default_target = 0.25 if not any(files) else 0.45
        self.files, self.test_limit = files, test_limit
        super().__init__(
            SmallConvNet(side=int(train[0].shape[-1])), train, test,
            loss_fn=F.cross_entropy, metric=metric,  # type: ignore[arg-type]
            direction="max" if metric == "accuracy" else "min",
            target=default_target if target is None else target,
            optimizer=OptimizerSpec(kind="adam", lr=lr), batch_size=batch_size, seed=seed,
            name="cnn", max_iterations=max_iterations, eval_every=10,
            step_seconds=step_seconds)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        names = ("train_images", "train_labels", "test_images", "test_labels")
        if any(self.files):
            d.update({k: v for k, v in zip(names, self.files) if v}, test_limit=self.test_limit)
        d["lr"] = self.default_optimizer.lr
        return d
