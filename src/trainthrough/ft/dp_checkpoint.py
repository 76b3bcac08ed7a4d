"""Saving and restoring a data-parallel group: one replica and the data position.

This is the one checkpoint writer of data parallel (:mod:`.shard_checkpoint` is the
parameter server's). Every live rank holds the same state, so a checkpoint is one
rank's :meth:`~trainthrough.dp.rank.Rank.state` (parameters, optimizer state, its
step count) in safetensors files, with the data cursor in the manifest: a restart
then replays exactly the batches the group would have trained on. It runs wherever
the replica lives (``sim``: the lowest live rank, in the engine's process; ``gloo``:
the first member, in its rank process), so both engines write the same files and
restore the same way. When to save and the accounting is
:class:`~trainthrough.ft.checkpointer.Checkpointer`; how a write spends time is the
host's.

Call order: :meth:`ReplicaCheckpoint.plan` (copies the replica and the cursor, at the
step boundary), then :meth:`ReplicaCheckpoint.write` (now, or later for a background
write). On a restart, a host that restores the whole group in one process calls
:meth:`ReplicaCheckpoint.latest`; a host with one process per rank calls it once, in
one place, to *choose* the step, and every process then loads exactly that one with
:meth:`ReplicaCheckpoint.load`: ranks that each looked for the newest valid
checkpoint could settle on different ones after a transient read error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainthrough.dp.batching import Cursor
from trainthrough.dp.rank import Replica
from trainthrough.ft.checkpoint import CheckpointInfo, CheckpointStore, require_ints

Tensors = dict[str, torch.Tensor]
TAG = "ckpt"
# The manifest fields a restore reads: anything else in them makes the checkpoint corrupt.
_CURSOR = require_ints("epoch", "offset")


@dataclass
class Planned:
    """A save copied from the replica, not yet written."""

    step: int
    tensors: Tensors
    meta: dict[str, Any]
    payload_bytes: int  # tensor data: what a write moves (headers and manifest aside)


@dataclass(frozen=True)
class Restored:
    """A checkpoint read back: the replica's tensors, the step and the data cursor."""

    step: int
    tensors: Tensors
    cursor: Cursor
    nbytes: int  # everything read (a host charges it)

    @property
    def params(self) -> Tensors:
        """The parameters alone, by name (what the perturbation compares)."""
        return {k[len("params/"):]: v for k, v in self.tensors.items() if k.startswith("params/")}


class ReplicaCheckpoint:
    """Saves of one data-parallel run under tag ``ckpt``, and their restore."""

    def __init__(self, store: CheckpointStore, template: Replica | None) -> None:
        """``template``: any replica of the run; a checkpoint must hold exactly its keys,
        dtypes and shapes (the values do not matter), or it is corrupt. None (a process
        that holds no replica, the controller of a user's own loop) or a replica whose
        keys are not fixed in advance (``state_like`` None): the checkpoint's own
        checksums are verified here and its keys by the replica that loads it."""
        self.store = store
        self._like = template.state_like() if template is not None else None

    # -- saving -----------------------------------------------------------------
    def plan(self, rank: Replica, iteration: int, cursor: Cursor, ranks: list[int],
             copy: bool = True) -> Planned:
        """Copy ``rank``'s replica and the cursor as the save of logical ``iteration``
        (``copy`` False: its live tensors, for a write that ends before it changes)."""
        tensors = rank.state(copy)
        meta = {"iteration": iteration, "epoch": cursor.epoch, "offset": cursor.offset,
                "ranks": ranks, "workload": rank.label}
        return Planned(iteration, tensors, meta,
                       sum(t.numel() * t.element_size() for t in tensors.values()))

    def write(self, p: Planned) -> CheckpointInfo:
        """Write a planned save (atomically; the store prunes to its ``keep_last``).

        Raises:
            CheckpointWriteFailed: the location cannot be written.
        """
        return self.store.save(p.step, p.tensors, p.meta, tag=TAG)

    # -- restoring --------------------------------------------------------------
    def exists(self) -> bool:
        """A complete save is listed (it may still fail verification)."""
        return bool(self.store.list(TAG))

    def latest(self, on_corrupt: Callable[[str], None]) -> Restored | None:
        """The newest save that verifies; each newer one that does not is reported to
        ``on_corrupt`` (naming it) and skipped. None: nothing valid, start over."""
        loaded = self.store.load_latest(TAG, on_corrupt, like=self._like, check=_CURSOR)
        return None if loaded is None else _restored(*loaded)

    def load(self, step: int) -> Restored:
        """Exactly the save of ``step`` (the one :meth:`latest` chose elsewhere).

        Raises:
            CheckpointCorrupt: it is missing or fails verification.
        """
        return _restored(*self.store.load(step, TAG, like=self._like, check=_CURSOR))


def _restored(tensors: Tensors, info: CheckpointInfo) -> Restored:
    return Restored(info.step, tensors, Cursor(info.meta["epoch"], info.meta["offset"]),
                    info.nbytes)
