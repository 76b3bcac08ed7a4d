"""SCAR's prioritized checkpoints, the rows: which to save, and how much each changed.

The policy that decides when (and the rules' names) is :mod:`.prioritized`; this is
the part that reads tensors, for the engines that save shards.
"""

from __future__ import annotations

import torch

INDEX_BYTES = 4  # row indices are stored as int32


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
