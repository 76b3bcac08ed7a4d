"""Shared data helpers for workloads: bundled datasets and deterministic batching."""

from __future__ import annotations

import gzip
import importlib.util
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from trainthrough.errors import UserError

#: The largest dense array a workload draws from its options (50 M float32 = 200 MB):
#: past it a slip such as ``n_users=10**9`` would exhaust memory instead of running.
MAX_CELLS = 50_000_000


def require_file(path: Path) -> None:
    """Raises: UserError if ``path`` is missing or is not a regular file."""
    if path.is_dir():
        raise UserError(f"{path}: is a folder; give the data file itself")
    if not path.is_file():
        raise UserError(f"{path}: no such file")


def check_batches(workload: str, n: int, batch_size: int, workers: int) -> None:
    """Every worker needs at least one mini-batch of its own.

    Raises:
        UserError: naming the option or flag to lower.
    """
    if batch_size > n:
        raise UserError(f"{workload}: batch_size {batch_size} is more than the {n} training "
                        "samples; use a smaller batch_size option")
    if workers > n // batch_size:
        raise UserError(f"{workload}: {workers} workers leave fewer than one batch of "
                        f"{batch_size} each; use at most {n // batch_size} workers")


def check_cells(workload: str, cells: int, what: str) -> None:
    """Refuse a dense array of ``cells`` elements above :data:`MAX_CELLS`.

    Raises:
        UserError: naming the options that size it.
    """
    if cells > MAX_CELLS:
        raise UserError(f"{workload}: {what} would hold {cells:,} values, above the limit "
                        f"of {MAX_CELLS:,}; use smaller sizes")


@lru_cache(maxsize=1)
def digits_split(test_fraction: float = 0.2) -> tuple[torch.Tensor, torch.Tensor,
                                                      torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled 8x8 digits, pixels scaled to [0, 1], fixed split.

    The split is fixed (not seeded by the run) so every run of every strategy is
    scored on the same test set.
    """
    data, target = _digits()
    x = torch.tensor(data / 16.0, dtype=torch.float32)
    y = torch.tensor(target, dtype=torch.long)
    perm = torch.tensor(np.random.RandomState(0).permutation(len(y)))
    n_test = int(len(y) * test_fraction)
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits' pixels (float64, 1797 x 64) and labels, read from the file
    scikit-learn ships, as its ``load_digits`` reads it, without importing it.

    Why: ``import sklearn`` pulls in scipy and costs seconds, more than torch, in
    every process that builds mlr or cnn: the driver, each Ray actor, each gloo rank
    (docs/measurements.md). The package is only
    located here (``find_spec`` does not run it). Where its data file is not a plain
    file (a zipped install), ``load_digits`` itself is used.
    """
    spec = importlib.util.find_spec("sklearn")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt", encoding="utf-8") as f:
                table = np.loadtxt(f, delimiter=",")
            return table[:, :-1], table[:, -1].astype(int)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data, d.target


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
            # Modulo: a 32-bit run seed times these factors overflows torch's 64 bits.
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % 2**63)
            perm = torch.randperm(self.n, generator=g)
            self._perms[epoch] = perm
        return perm[k * self.batch_size:(k + 1) * self.batch_size]


def split_rows(n: int, parts: int) -> list[slice]:
    """Contiguous, near-equal slices of ``range(n)``."""
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
