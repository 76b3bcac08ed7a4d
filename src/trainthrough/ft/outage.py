"""What workers do while a shard is down: wait, or keep computing and buffer (stateless PS).

The stateless parameter server of *Training Through Failure*: while a shard is
down, workers keep computing updates on the last parameters they hold and queue
them; when the shard is back (restored from its latest checkpoint) the backlog is
applied. This module is the pure part: the bounded buffer and the merge rule that
decides the step scale of each buffered update. Engines own the tensors' journey.

Merge rules (``rule``):

- ``sum``: every buffered update applied at full step (what a plain PS would do);
- ``mean``: the backlog averaged into one step of the usual size;
- ``scaled``: full steps while at most ``threshold`` are pending, then each is
  scaled by ``threshold / pending`` (the paper's code lowered the step size when
  more than 50 gradients were pending: ``threshold=50``);
- ``staleness``: each update weighted ``1 / (1 + staleness)``, staleness counted in
  updates computed since the parameters it used.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

RULES = ("sum", "mean", "scaled", "staleness")
T = TypeVar("T")


@dataclass(frozen=True)
class MergeDecision:
    """How to apply one buffered update: its position and its step scale."""

    index: int
    scale: float


def merge_plan(staleness: list[int], rule: str, threshold: int = 50) -> list[MergeDecision]:
    """Scales for a backlog, oldest first.

    Args:
        staleness: for each buffered update (oldest first), how many updates had
            been computed on top of the parameters it used.
        rule: one of :data:`RULES`.
        threshold: the ``scaled`` rule's backlog size that still gets full steps.

    Raises:
        ValueError: unknown rule or a non-positive threshold.
    """
    n = len(staleness)
    if rule not in RULES:
        raise ValueError(f"merge rule must be one of {', '.join(RULES)} (got {rule!r})")
    if threshold < 1:
        raise ValueError("threshold must be at least 1")
    if rule == "sum":
        scales = [1.0] * n
    elif rule == "mean":
        scales = [1.0 / n] * n if n else []
    elif rule == "scaled":
        scales = [1.0 if n <= threshold else threshold / n] * n
    else:
        scales = [1.0 / (1 + s) for s in staleness]
    return [MergeDecision(i, s) for i, s in enumerate(scales)]


class Backlog(Generic[T]):
    """A bounded FIFO of updates computed while a shard was down.

    When full, the two oldest entries are merged by ``combine`` (so memory stays
    bounded and the oldest information is folded, not dropped): that is why the
    caller supplies it.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError("backlog capacity must be at least 2")
        self.capacity = capacity
        self.items: deque[tuple[T, int]] = deque()  # (update, staleness)
        self.merged = 0

    def add(self, update: T, staleness: int, combine: Callable[[T, T], T]) -> None:
        if len(self.items) >= self.capacity:
            (a, sa), (b, sb) = self.items.popleft(), self.items.popleft()
            self.items.appendleft((combine(a, b), max(sa, sb)))
            self.merged += 1
        self.items.append((update, staleness))

    def drain(self) -> list[tuple[T, int]]:
        out = list(self.items)
        self.items.clear()
        return out

    def __len__(self) -> int:
        return len(self.items)
