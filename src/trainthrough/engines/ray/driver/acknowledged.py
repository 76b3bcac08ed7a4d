"""Acknowledged pushes lost: the run's ``acknowledged_lost`` count, in updates.

A worker counts, per shard, the pushes the shard acknowledged (``acked_pushes``, summed
over the worker's incarnations); a replica's state counts, per worker, the pushes it
holds (``Shard.held``: it travels with the state, to a checkpoint, a replica, a
restore). Both counts only grow while a shard serves, by one per acknowledged push,
so what a chain's state lacks stays visible to the end: a (shard, worker) pair's loss
is ``acknowledged - held``, the pushes the shard acknowledged that its state no longer
holds. Sequence numbers could not say that (a replacement worker's start 2**40 higher,
a flushed backlog taking one number per push).

Two checks, both in updates:

- **When a wiped chain is restored** (every replica of a shard lost: restored from its
  checkpoint, or reinitialized), before the restored shard serves: each pair's loss so
  far, recorded (``acknowledged_lost_wiped``; the ``up`` event's ``acknowledged_lost``
  is what this restore added). A second wipe adds only what it lost beyond the first.
- **At the end of the run**: per pair, the most any live replica holds against the
  pushes acknowledged (a chain with no replica left holds none); the loss is the larger
  of that and what the restores recorded, so pushes applied but never acknowledged (a
  worker killed between the apply and the answer) cannot hide a loss a restore saw.

Only chains are counted: a non-replicated shard restarts by its strategy's design,
losing what came after its checkpoint, which its recovery record's
``perturbation_norm_lost`` measures (docs/strategies.md). A worker killed after its
last report had pushes acknowledged that are not counted: the counts can understate a
loss, never invent one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainthrough.engines.ray.actors.reports import Progress

Pair = tuple[int, int]  # (shard, worker id)


def acknowledged(progress: dict[str, Progress], index: dict[str, int]) -> dict[Pair, int]:
    """Per (shard, worker id), the pushes acknowledged, summed over the worker's
    incarnations (``index``: a worker actor's name to its worker id)."""
    acked: dict[Pair, int] = {}
    for name, p in progress.items():
        w = index[name]
        for shard, n in p.get("acked_pushes", {}).items():
            key = (int(shard), w)
            acked[key] = acked.get(key, 0) + int(n)
    return acked


@dataclass(frozen=True)
class Losses:
    """The run's acknowledged losses: ``updates`` (pushes) and the pairs with any."""

    updates: int
    pairs: int
    detail: list[dict[str, Any]]  # per pair with a loss: shard, worker, counts, lost


class AcknowledgedLedger:
    """The losses the wiped chains' restores found, per pair."""

    def __init__(self) -> None:
        self._wiped: dict[Pair, int] = {}  # per pair, the updates restores found lost

    @property
    def wiped(self) -> int:
        """Updates lost, as the restores of wiped chains found them."""
        return sum(self._wiped.values())

    def restored(self, shard: int, acked: dict[Pair, int], held: dict[int, int],
                 restored_from: int | None) -> list[dict[str, Any]]:
        """Shard ``shard``'s chain was wiped and restored to a state holding ``held``
        pushes per worker (``restored_from``: the checkpoint's iteration, None if
        reinitialized): the pairs whose acknowledged pushes it lacks beyond what an
        earlier restore found, with ``lost`` the updates this restore adds."""
        found = []
        for (s, w), n in sorted(acked.items()):
            if s != shard:
                continue
            lost = n - held.get(w, 0)
            new = lost - self._wiped.get((s, w), 0)
            if new <= 0:
                continue
            self._wiped[(s, w)] = lost
            found.append({"shard": s, "worker": w, "acknowledged": n, "held": held.get(w, 0),
                          "lost": new, "wiped": True, "restored_from": restored_from})
        return found

    def at_end(self, acked: dict[Pair, int],
               replicas: dict[int, list[dict[int, int]]]) -> Losses:
        """Every loss of the run, per pair: the pushes acknowledged against the most
        any live replica of its chain holds (``replicas``: per shard counted, each live
        replica's pushes held per worker; an empty list: no replica left), and never
        less than the restores found."""
        detail = []
        for (s, w), n in sorted(acked.items()):
            if s not in replicas:
                continue
            held = max((h.get(w, 0) for h in replicas[s]), default=0)
            lost = max(n - held, self._wiped.get((s, w), 0))
            if lost > 0:
                detail.append({"shard": s, "worker": w, "acknowledged": n, "held": held,
                               "lost": lost, "wiped": (s, w) in self._wiped})
        return Losses(sum(d["lost"] for d in detail), len(detail), detail)
