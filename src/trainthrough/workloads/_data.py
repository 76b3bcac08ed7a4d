"""Shared data helpers for workloads: bundled datasets and deterministic batching."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch


@lru_cache(maxsize=1)
def digits_split(test_fraction: float = 0.2) -> tuple[torch.Tensor, torch.Tensor,
                                                      torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled 8x8 digits, pixels scaled to [0, 1], fixed split.

    The split is fixed (not seeded by the run) so every run of every strategy is
    scored on the same test set.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.tensor(np.random.RandomState(0).permutation(len(y)))
    n_test = int(len(y) * test_fraction)
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


class BatchSchedule:
    """Which rows of a worker's data make up its mini-batch at logical step k.

    Each epoch is a permutation seeded by (seed, epoch); batch k is a slice of it.
    Depending only on k is what makes a rolled-back run replay the same batches.
    """

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n = n
        self.batch_size = min(batch_size, n)
        self.per_epoch = max(1, n // self.batch_size)
        self.seed = seed
        self._perms: dict[int, torch.Tensor] = {}

    def indices(self, step: int) -> torch.Tensor:
        epoch, k = divmod(step, self.per_epoch)
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) > 4:  # keep memory flat on long runs
                self._perms.clear()
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = torch.randperm(self.n, generator=g)
            self._perms[epoch] = perm
        return perm[k * self.batch_size:(k + 1) * self.batch_size]


def split_rows(n: int, parts: int) -> list[slice]:
    """Contiguous, near-equal slices of ``range(n)``."""
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
