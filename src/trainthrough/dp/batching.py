"""Which samples a data-parallel step trains on, and how they split over ranks.

The global mini-batch of a step is a slice of an epoch permutation of the whole
training set, read at a cursor. It is cut into equal micro-batches numbered in
global order, and each rank takes a contiguous run of them. Neither the global batch
nor its micro-batches depend on how many ranks share them, so a step redone on fewer
ranks (mini-batch rollback) trains on exactly the same samples, and a reduction in
micro-batch order (:mod:`trainthrough.dp.allreduce`) gives exactly the same bits.
This mirrors torch's ``DistributedSampler``: every rank can read every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trainthrough.errors import UserError


@dataclass(frozen=True)
class Cursor:
    """Where the sample stream stands: an epoch and an offset into its permutation."""

    epoch: int = 0
    offset: int = 0


@dataclass(frozen=True)
class MicroBatch:
    """Rows of the training set; ``index`` is its place in the global batch."""

    index: int
    rows: torch.Tensor


class SampleStream:
    """Epoch permutations of ``range(n)``, each seeded by (seed, epoch)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) > 4:  # rollbacks revisit recent epochs only
                self._perms.clear()
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + 7 * epoch + 1)
            perm = self._perms[epoch] = torch.randperm(self.n, generator=g)
        return perm

    def take(self, cursor: Cursor, size: int) -> tuple[torch.Tensor, Cursor]:
        """The next ``size`` rows and the cursor after them.

        A batch never straddles two epochs: the remainder of an epoch too small for
        it is skipped (``drop_last``), so batch boundaries depend on the sizes only.

        Raises:
            UserError: ``size`` exceeds the training set.
        """
        if size > self.n:
            raise UserError(f"a global batch of {size} samples exceeds the {self.n} training "
                            "samples; use fewer ranks or a smaller batch_size option")
        epoch, offset = cursor.epoch, cursor.offset
        if offset + size > self.n:
            epoch, offset = epoch + 1, 0
        return self._perm(epoch)[offset:offset + size], Cursor(epoch, offset + size)


def micro_size(batch_size: int, parts: int) -> int:
    """The largest divisor of ``batch_size`` that is at most ``batch_size / parts``
    (``parts``: the run's ``micro_batches`` per rank).

    Micro-batches must all be the same size, so that the mean of their mean
    gradients is the mean gradient of the global batch. Their size is fixed by the
    nominal per-rank batch, never by the group's size: a step redone on fewer ranks
    sums the same micro-batches (bit-exact in ``sim`` whatever ``parts``).
    """
    target = max(1, batch_size // parts)
    return next(d for d in range(target, 0, -1) if batch_size % d == 0)


def split_micro(rows: torch.Tensor, size: int) -> list[MicroBatch]:
    """Cut ``rows`` into micro-batches of ``size`` (``len(rows)`` must be a multiple)."""
    if len(rows) % size:
        raise ValueError(f"{len(rows)} rows do not split into micro-batches of {size}")
    return [MicroBatch(j, rows[j * size:(j + 1) * size]) for j in range(len(rows) // size)]


def assign(count: int, ranks: int) -> list[range]:
    """Contiguous, near-equal runs of ``range(count)``, one per rank, in rank order."""
    if ranks < 1:
        raise ValueError("a group needs at least one rank")
    bounds = np.linspace(0, count, ranks + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass(frozen=True)
class StepBatch:
    """One step's work: each member slot's micro-batches, the lr multiplier, the next cursor."""

    share: dict[int, list[MicroBatch]]
    lr_scale: float
    next_cursor: Cursor

    @property
    def micro_count(self) -> int:
        """Micro-batches in the global batch."""
        return sum(len(m) for m in self.share.values())

    @property
    def most_micro(self) -> int:
        """Micro-batches on the busiest rank (it sets the step's compute time)."""
        return max(len(m) for m in self.share.values())

    def micro_of(self, members: Sequence[int]) -> int:
        """Micro-batches that ``members`` train on (lossy forward: the survivors')."""
        return sum(len(self.share.get(s, ())) for s in members)


def plan_batch(stream: SampleStream, cursor: Cursor, global_batch: int, lr_scale: float,
               members: Sequence[int], micro: int) -> StepBatch:
    """What ``members`` (slots, in rank order) train on from ``cursor``.

    ``global_batch`` and ``lr_scale`` come from the elastic policy for this group;
    the batch is cut into micro-batches of ``micro`` rows and each member takes a
    contiguous run. Every host plans the same way, so the same cursor and group
    give the same batch everywhere.
    """
    rows, nxt = stream.take(cursor, global_batch)
    parts = split_micro(rows, micro)
    share = {s: [parts[j] for j in r] for s, r in zip(members, assign(len(parts), len(members)))}
    return StepBatch(share, lr_scale, nxt)
