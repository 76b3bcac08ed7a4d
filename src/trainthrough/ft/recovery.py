"""Recovery policies: what to restore when shards are lost.

Protocol: on a failure the engine calls :meth:`RecoveryPolicy.decide` with the lost
shard ids and whether a valid checkpoint exists; it gets back a
:class:`~trainthrough.ft.decisions.RecoveryDecision` and carries it out.
"""

from __future__ import annotations

from typing import Protocol

from trainthrough.ft.decisions import RecoveryAction, RecoveryDecision


class RecoveryPolicy(Protocol):
    """Decides how lost shards come back."""

    def decide(self, lost: tuple[int, ...], have_checkpoint: bool) -> RecoveryDecision: ...


class Reinitialize:
    """Lost shards restart from initial values; nothing else changes."""

    def decide(self, lost: tuple[int, ...], have_checkpoint: bool) -> RecoveryDecision:
        return RecoveryDecision(RecoveryAction.REINIT, lost)


class RollbackAll:
    """Traditional recovery: every shard, and the iteration, back to the checkpoint.

    With no checkpoint yet, "the checkpoint" is the start of training.
    """

    def decide(self, lost: tuple[int, ...], have_checkpoint: bool) -> RecoveryDecision:
        return RecoveryDecision(RecoveryAction.ROLLBACK_ALL, lost, rewind=True,
                                from_checkpoint=have_checkpoint)


class RestoreLost:
    """SCAR partial recovery: only the lost shards come from the checkpoint."""

    def decide(self, lost: tuple[int, ...], have_checkpoint: bool) -> RecoveryDecision:
        if not have_checkpoint:
            return RecoveryDecision(RecoveryAction.REINIT, lost)
        return RecoveryDecision(RecoveryAction.RESTORE_LOST, lost, from_checkpoint=True)


class FromWorkerCopies:
    """Lost rows from the freshest copy a live worker pulled (ft/worker_copy.py).

    The engine first brings the lost shards back from the checkpoint if there is one
    (else from initial values): that supplies the optimizer state, and the rows no
    live worker holds. It then overwrites every row a live worker holds with the
    freshest such copy. Optimizer state (momentum, Adam moments) is never on a worker,
    so it is the checkpoint's, up to N iterations old, or fresh zeros without one; a
    stale moment is closer to the lost one than zeros, and an Adam step count restarted
    at zero would make the first steps after recovery full-size. Nothing rewinds.
    """

    def decide(self, lost: tuple[int, ...], have_checkpoint: bool) -> RecoveryDecision:
        return RecoveryDecision(RecoveryAction.WORKER_COPY, lost,
                                from_checkpoint=have_checkpoint)
