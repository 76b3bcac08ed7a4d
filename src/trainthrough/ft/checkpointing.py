"""Checkpoint policies: when to save, and how much.

Protocol (call order): the engine calls :meth:`CheckpointPolicy.decide` after
every applied iteration with the logical iteration just completed; a decision
means "save now", ``None`` means "not this time". Policies hold no tensors.
"""

from __future__ import annotations

from typing import Protocol

from trainthrough.ft.decisions import CheckpointDecision


class CheckpointPolicy(Protocol):
    """Decides when to checkpoint."""

    def decide(self, iteration: int) -> CheckpointDecision | None: ...


class NoCheckpoints:
    """Never save (the cost of doing nothing)."""

    def decide(self, iteration: int) -> CheckpointDecision | None:
        return None


class FullEvery:
    """A full checkpoint every ``every`` iterations (traditional)."""

    def __init__(self, every: int, asynchronous: bool = False) -> None:
        if every < 1:
            raise ValueError(f"checkpoint interval must be at least 1 (got {every})")
        self.every = every
        self.asynchronous = asynchronous

    def decide(self, iteration: int) -> CheckpointDecision | None:
        if iteration > 0 and iteration % self.every == 0:
            return CheckpointDecision(1.0, "all", self.asynchronous)
        return None
