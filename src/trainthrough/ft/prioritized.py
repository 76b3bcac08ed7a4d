"""SCAR's prioritized checkpoints: save the rows that changed most, a fraction at a time.

Every ``r * N`` iterations each shard saves the rows whose values moved most since
they were last saved, within a byte credit that grows by ``r`` times a full
checkpoint of the shard per save (row indices count against it, and unspent credit
carries over, so over ``N`` iterations the bytes written equal one full checkpoint
even when ``r`` of a shard is less than a row). The freshest saved copy of each row
is what recovery restores.

This module holds the pure parts: the policy (when), the selection rules (which
rows) and the row bookkeeping. Engines move the tensors.
"""

from __future__ import annotations

import torch

from trainthrough.ft.decisions import CheckpointDecision

RULES = ("largest-change", "random", "round-robin")
INDEX_BYTES = 4  # row indices are stored as int32


class PrioritizedEvery:
    """Decide a partial save every ``p = max(1, round(r * N))`` iterations.

    The fraction each save may write is ``p / N``, not ``r``: ``r * N`` is rarely a
    whole number, and writing ``r`` every ``p`` iterations would write more (or less)
    than one full checkpoint per ``N`` (with N=5 and r=0.25, p=1: 25% more).
    """

    def __init__(self, every: int, fraction: float, rule: str = "largest-change",
                 asynchronous: bool = False) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"checkpoint fraction must be in (0, 1] (got {fraction})")
        if rule not in RULES:
            raise ValueError(f"selection rule must be one of {', '.join(RULES)} (got {rule!r})")
        self.rule = rule
        self.period = max(1, round(fraction * every))
        self.fraction = min(1.0, self.period / every)
        self.asynchronous = asynchronous

    def decide(self, iteration: int) -> CheckpointDecision | None:
        if iteration > 0 and iteration % self.period == 0:
            return CheckpointDecision(self.fraction, self.rule, self.asynchronous)
        return None


def select_rows(change: torch.Tensor, row_bytes: torch.Tensor, budget: float, rule: str,
                cursor: int = 0, gen: torch.Generator | None = None) -> tuple[torch.Tensor, int]:
    """Pick rows to save within ``budget`` bytes.

    Args:
        change: per-row size of the change since the row was last saved.
        row_bytes: bytes one row costs to save (values, optimizer state, its index).
        budget: bytes this save may write.
        rule: ``largest-change`` (descending change), ``random`` (seeded ``gen``) or
            ``round-robin`` (cyclic from ``cursor``).
        cursor: where round-robin resumes.

    Returns:
        (sorted row indices, possibly none if not even one row fits; the next
        round-robin cursor).
    """
    n = change.numel()
    if rule == "largest-change":
        # Stable sort on (-change, row) so ties, e.g. rows that never moved, are
        # taken in row order and the choice is deterministic.
        order = torch.argsort(-change.double(), stable=True)
    elif rule == "random":
        order = torch.randperm(n, generator=gen)
    else:
        order = torch.roll(torch.arange(n), -(cursor % max(n, 1)))
    cum = torch.cumsum(row_bytes[order].double(), 0)
    k = int(torch.searchsorted(cum, torch.tensor(budget, dtype=torch.float64), right=True))
    chosen = order[:min(n, k)]
    return torch.sort(chosen).values, (cursor + len(chosen)) % max(n, 1)


def row_change(current: torch.Tensor, saved: torch.Tensor) -> torch.Tensor:
    """L2 norm per row of ``current - saved`` (rows along the first dimension)."""
    d = (current - saved).reshape(current.shape[0], -1)
    return d.norm(dim=1)
