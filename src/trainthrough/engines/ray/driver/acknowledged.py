"""Acknowledged pushes lost: the run's ``acknowledged_lost`` count, from two checks.

A worker records, per shard, the highest sequence number the shard acknowledged; a
replica's dedup table (``Shard.applied``) the highest it applied, per worker. A
(shard, worker) pair whose acknowledged push a replica lacks is a loss. Two checks:

- **When a wiped chain is restored** (every replica of a shard lost: restored from its
  checkpoint, or reinitialized): the workers' acknowledged sequence numbers against the
  restored state's dedup table (a checkpoint's, or empty), taken before the restored
  shard serves, so no push can have been acknowledged since the wipe. Checked only
  there: once the shard serves again, the workers' later pushes lift its table above
  what they had acknowledged before, and the end-of-run check would no longer see it.
- **At the end of the run**: each serving replica's table against what the workers
  acknowledged last (a chain that kept a replica promises 0); a chain with no replica
  left (its restore not done when the run ended) lacks every acknowledged push.

The unit is the (shard, worker) pair, not the update: sequence numbers are not a
count (a worker's replacement starts 2**40 higher, a flushed backlog takes one number
per shard), so the number of updates behind a pair is not known here. A pair counts
once per check that finds it: once per restore that lost its acknowledged pushes (a
second wipe before the worker's next acknowledged push finds nothing new), and at the
end once per serving replica that lacks it, unless a restore already counted that
same acknowledged push.
"""

from __future__ import annotations

from typing import Any

from trainthrough.engines.ray.actors.reports import Progress

Pair = tuple[int, int]  # (shard, worker id)


def acknowledged(progress: dict[str, Progress], index: dict[str, int]) -> dict[Pair, int]:
    """Per (shard, worker id), the highest sequence number acknowledged, over the
    worker's incarnations (``index``: a worker actor's name to its worker id)."""
    acked: dict[Pair, int] = {}
    for name, p in progress.items():
        w = index[name]
        for shard, seq in p.get("acked", {}).items():
            key = (int(shard), w)
            acked[key] = max(acked.get(key, -1), int(seq))
    return acked


class AcknowledgedLedger:
    """The losses found so far, by both checks."""

    def __init__(self) -> None:
        self.wiped: list[dict[str, Any]] = []  #: losses found when wiped chains were restored
        self._counted: dict[Pair, int] = {}  # per pair, the acknowledged seq a restore counted

    def restored(self, shard: int, acked: dict[Pair, int], applied: dict[int, int],
                 restored_from: int | None) -> list[dict[str, Any]]:
        """Shard ``shard``'s chain was wiped and restored to a state whose dedup table
        is ``applied`` (``restored_from``: the checkpoint's iteration, None if
        reinitialized): the pairs whose acknowledged push it lacks, recorded."""
        lost = []
        for (s, w), q in sorted(acked.items()):
            if s != shard or applied.get(w, -1) >= q or q <= self._counted.get((s, w), -1):
                continue
            self._counted[(s, w)] = q
            lost.append({"shard": s, "worker": w, "acknowledged": q,
                         "applied": applied.get(w, -1), "wiped": True,
                         "restored_from": restored_from})
        self.wiped += lost
        return lost

    def at_end(self, acked: dict[Pair, int],
               replicas: dict[int, dict[str | None, dict[int, int]]]) -> list[dict[str, Any]]:
        """Every loss of the run: the restores' and, per serving replica
        (``replicas``: per shard, each replica's name and dedup table; an empty dict
        for a chain with no replica left), the pairs whose last acknowledged push it
        lacks (none a restore counted already)."""
        lost = list(self.wiped)
        for shard, tables in sorted(replicas.items()):
            # A shard with no replica left (wiped, its restore not done when the run
            # ended) holds nothing: every pair a restore has not counted is lost.
            for name, applied in (tables or {None: {}}).items():
                lost += [{"shard": s, "replica": name, "worker": w, "acknowledged": q,
                          "applied": applied.get(w, -1)}
                         for (s, w), q in sorted(acked.items())
                         if s == shard and applied.get(w, -1) < q
                         and q > self._counted.get((s, w), -1)]
        return lost
