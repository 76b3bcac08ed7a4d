"""SCAR's prioritized checkpoints: save the rows that changed most, a fraction at a time.

Every ``r * N`` iterations each shard saves the rows whose values moved most since
they were last saved, within a byte credit that grows by ``r`` times a full
checkpoint of the shard per save (row indices count against it, and unspent credit
carries over, so over ``N`` iterations the bytes written equal one full checkpoint
even when ``r`` of a shard is less than a row). The freshest saved copy of each row
is what recovery restores.

This module holds the policy (when) and the rules' names; the selection of rows and
their bookkeeping, which need torch, are in :mod:`.prioritized_rows`: a strategy is
declared (``ft/strategy.py``) where torch is not imported (the CLI's parser, a Ray
node's rank host).
"""

from __future__ import annotations

from trainthrough.ft.decisions import CheckpointDecision

RULES = ("largest-change", "random", "round-robin")


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
