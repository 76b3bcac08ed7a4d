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
    # Lost rows from the freshest copy live workers pulled; the rest (and optimizer
    # state) from the checkpoint, or initial values without one (ft/worker_copy.py).
    WORKER_COPY = "worker-copy"
    RESTART_WORKER = "restart-worker"  # a worker restarts with fresh local state
    # Data parallel (every rank holds a full replica; see ft/dp_policies.py):
    MINI_BATCH_ROLLBACK = "mini-batch-rollback"  # undo the step, redo it on survivors
    LOSSY_FORWARD = "lossy-forward"  # keep what was applied, average what arrived
    # Relaxed sync (dp/relaxed.py): the lost replica's local steps are dropped, the
    # survivors keep theirs and run the next (or the interrupted) outer step without it.
    DROP_LOCAL = "drop-local"


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


@dataclass(frozen=True)
class GroupRecoveryDecision:
    """How a data-parallel group goes on after losing the ranks ``failed``.

    ``ROLLBACK_ALL``: every rank reloads the checkpoint (``from_checkpoint``; else the
    initial parameters), the iteration rewinds and failed ranks are replaced before
    training resumes. Otherwise the survivors ``reform`` a group without the failed
    ranks; ``redo_step``: the step runs again on the new group;
    ``complete_step``: the step is finished with the contributions that arrived.
    """

    action: RecoveryAction
    failed: tuple[int, ...]
    reform: bool = False
    redo_step: bool = False
    complete_step: bool = False
    from_checkpoint: bool = False
    rewind: bool = False


@dataclass(frozen=True)
class ElasticDecision:
    """The batch a group of ``ranks`` trains on, and its learning-rate multiplier."""

    ranks: int
    global_batch: int
    lr_scale: float = 1.0


@dataclass(frozen=True)
class ReplacementDecision:
    """Replacement ranks for ``slots`` join at simulated time ``at_seconds``."""

    slots: tuple[int, ...]
    at_seconds: float
