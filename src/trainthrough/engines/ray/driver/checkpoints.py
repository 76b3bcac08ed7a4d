"""The ``ray`` host of the parameter-server checkpointer: each shard's actor saves itself.

When to save and the accounting is :class:`~trainthrough.ft.checkpointer.Checkpointer`;
what is saved and restored is :class:`~trainthrough.ft.shard_checkpoint.ShardCheckpoint`,
run inside every shard actor (the same code as ``sim``). The driver only asks the heads
to save and, on recovery, to restore. A rollback of several shards lands them on one
common step: a shard whose newest save was corrupt makes the others go back with it.
It knows nothing of the engine: it is given the store, the heads to ask, and where
events go.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from trainthrough.engines.ray.actors.reports import RestoreInfo, SaveInfo
from trainthrough.events import CheckpointCorrupt, CheckpointFailed, CheckpointSkipped
from trainthrough.ft.checkpointer import Emit, SaveReport
from trainthrough.ft.decisions import CheckpointDecision
from trainthrough.ft.shard_checkpoint import restore_together


def keep_for(checkpoint: str, keep: int) -> int:
    """Full saves keep the newest ``keep``; prioritized ones are pruned by row ownership."""
    return keep if checkpoint == "full" else 10**9


class RayShardSaves:
    """Save backend: ``checkpoint`` on every shard's head actor.

    ``url``: the run's checkpoint store; ``checkpoint``: the strategy's kind (``full``
    or ``prioritized``), ``keep``: full saves kept; ``heads``: each shard's head actor
    now (None: the shard has none); ``emit``: where events go.
    """

    def __init__(self, url: str, checkpoint: str, keep: int, seed: int,
                 heads: Callable[[], list[Any | None]], emit: Emit) -> None:
        self.url, self.checkpoint, self.seed = url, checkpoint, seed
        self.keep = keep_for(checkpoint, keep)
        self.heads, self.emit = heads, emit

    def _args(self) -> tuple[str, int, int]:
        return self.url, self.keep, self.seed

    def save(self, d: CheckpointDecision, iteration: int,
             done: Callable[[SaveReport], None]) -> None:
        refs = [h.checkpoint.remote(*self._args(), d, iteration)
                for h in self.heads() if h is not None]
        try:
            infos: list[SaveInfo] = ray.get(refs, timeout=120)
        except (ray.exceptions.RayError, TimeoutError):
            return  # a shard died mid-save: its previous save stays valid
        names = [n for i in infos if (n := i.get("name"))]
        errors = [i["error"] for i in infos if i.get("error")]
        if any(i.get("skipped") for i in infos):
            # The previous background write was still running: this save is not taken
            # (by every shard that was busy), and the run says so.
            self.emit(CheckpointSkipped(iteration=iteration,
                                        shards=sum(1 for i in infos if i.get("skipped"))))
        if not names and not errors:
            return  # no shard had credit for a row yet
        done(SaveReport(sum(i["bytes"] for i in infos), sum(i["payload"] for i in infos),
                        max((i["blocked"] for i in infos), default=0.0), names, errors))

    def stats(self) -> dict[str, Any]:
        """Checkpoint writes of the heads in service, summed: ``checkpoint_writes``,
        ``checkpoint_skipped``, ``checkpoint_write_seconds`` (all of each write, prune
        included) and ``checkpoint_last_write_seconds`` / ``..._prune_seconds``
        (the store's split of each head's last write, summed over shards)."""
        heads = [h for h in self.heads() if h]
        try:
            ss = ray.get([h.checkpoint_stats.remote() for h in heads], timeout=30)
        except (ray.exceptions.RayError, TimeoutError):
            return {}
        return {"checkpoint_writes": sum(s["writes"] for s in ss),
                "checkpoint_skipped": sum(s["skipped"] for s in ss),
                "checkpoint_write_seconds": sum(s["seconds"] for s in ss),
                "checkpoint_last_write_seconds": sum(s["last_write"] for s in ss),
                "checkpoint_last_prune_seconds": sum(s["last_prune"] for s in ss)}

    def restore(self, handles: list[Any]) -> int | None:
        """Restore the shards behind ``handles`` (in parallel) onto one common step
        (:func:`~trainthrough.ft.shard_checkpoint.restore_together`); return it.

        Raises:
            ray.exceptions.RayError: one of them died while restoring.
        """
        args = self._args()

        def restore(indices: list[int], at_most: int | None) -> list[int | None]:
            refs = [handles[i].restore.remote(*args, at_most) for i in indices]
            return [_step(r, self.emit) for r in ray.get(refs, timeout=120)]

        steps = restore_together(restore, len(handles), self.checkpoint == "prioritized")
        valid = [s for s in steps if s is not None]
        return max(valid) if valid else None


def _step(result: RestoreInfo, emit: Emit) -> int | None:
    """What one actor's restore reported: emit what it skipped; return its step."""
    for msg in result.get("skipped", []):
        emit(CheckpointCorrupt(message=msg))
    if result.get("error"):
        emit(CheckpointFailed(message=result["error"]))
    step = result.get("step")
    return int(step) if step is not None else None
