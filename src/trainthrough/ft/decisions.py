"""The plain decision objects that fault-tolerance policies return.

Policies decide, engines act: a policy looks at a few numbers and returns one of
these frozen values; an engine carries it out. That keeps every policy testable
without a process, a clock or a tensor.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RecoveryAction(enum.Enum):
    """What recovery restores after components are lost."""

    REINIT = "reinit"  # lost shards start again from the workload's initial values
    ROLLBACK_ALL = "rollback-all"  # every shard back to the checkpoint; iteration too
    RESTORE_LOST = "restore-lost"  # only lost shards from the checkpoint (SCAR partial)
    FAILOVER = "failover"  # promote a live replica; nothing is rolled back
    RESTART_WORKER = "restart-worker"  # a worker restarts with fresh local state


@dataclass(frozen=True)
class CheckpointDecision:
    """Save now: ``fraction`` of rows (1.0 = full) chosen by ``rule``; sync or async."""

    fraction: float = 1.0
    rule: str = "all"
    asynchronous: bool = False


@dataclass(frozen=True)
class RecoveryDecision:
    """How to recover the lost ``shards`` (and whether the run's iteration rewinds)."""

    action: RecoveryAction
    shards: tuple[int, ...] = ()
    rewind: bool = False
    from_checkpoint: bool = False
