"""What the driver's helpers use of the engine: the :class:`Driver` protocol.

:mod:`.recovery` (what is done about a death) and :mod:`.bsp` (bulk-synchronous
rounds) act on the engine's run from inside its loop. They read the run and change it
through this protocol only; :class:`~trainthrough.engines.ray.driver.engine.RayEngine`
implements it. Everything else of the engine is private to it.

All of it runs on the driver's one thread: nothing here is guarded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trainthrough.config import RunConfig
    from trainthrough.engines.base import RunContext
    from trainthrough.engines.ray.actors.reports import Progress
    from trainthrough.engines.ray.driver.bsp import BulkSynchronous
    from trainthrough.engines.ray.driver.checkpoints import RayShardSaves
    from trainthrough.engines.ray.driver.cluster import RayCluster
    from trainthrough.engines.ray.driver.members import Member
    from trainthrough.engines.ray.driver.recovery import Measuring, Replacement
    from trainthrough.engines.result import RunResult
    from trainthrough.events import Event
    from trainthrough.faults.schedule import FailureEvent, FailureSchedule
    from trainthrough.ft.checkpointer import Checkpointer
    from trainthrough.ft.recovery import RecoveryPolicy
    from trainthrough.ps.layout import Layout


class Driver(Protocol):
    """The engine as its helpers see it."""

    # -- the run --------------------------------------------------------------------
    cfg: RunConfig
    ctx: RunContext  #: the run's context: clock, evaluations, callback
    result: RunResult  #: what the run reports, filled as it goes
    layout: Layout
    cluster: RayCluster  #: the run's actors
    schedule: FailureSchedule  #: the failures still due
    checkpointer: Checkpointer  #: when to save (and how many saves were taken)
    saves: RayShardSaves  #: how shards save and restore
    recovery_policy: RecoveryPolicy  #: what a lost shard's recovery does
    max_iter: int
    aggregate: str  #: how the workers' updates combine ("mean" or "sum")
    #: the bulk-synchronous rounds when the run has them (None: asynchronous workers)
    bsp: BulkSynchronous | None

    # -- recoveries under way (recovery.py adds and takes them) -----------------------
    pending: list[Replacement]  #: replacements waiting for their down time to end
    measuring: list[Measuring]  #: recoveries waiting for their first update applied
    incarnation: list[int]  #: per worker id: replacements started so far

    def emit(self, event: Event) -> None:
        """Record an event of the run (stamped with the wall clock)."""

    def strike(self, e: FailureEvent, iteration: int) -> None:
        """Carry out a failure that fell due at executed ``iteration``: kill its
        victims, count and record each (their :class:`~.members.Strike`)."""

    def on_death(self, m: Member, iteration: int) -> None:
        """``m`` was seen dead: fail over, or start its replacement (recovery.py)."""

    def activate_due(self, iteration: int, runs: dict[str, Any]) -> None:
        """Put in service each pending replacement that is ready and whose down time
        is over; ``runs``: the asynchronous workers' ``run`` refs, by name (a worker
        put in service adds its own)."""

    def measure(self) -> None:
        """Close the recoveries whose shard has applied an update since (recovery
        seconds: from the kill to that update)."""

    def chain_wiped(self, shard: int, handle: Any, restored_from: int | None) -> int:
        """Every replica of ``shard`` was lost and ``handle`` holds its restored state,
        not serving yet: record the acknowledged pushes the restore did not bring back;
        returns how many (shard, worker) pairs lost some."""

    def rewind(self, step: int, iteration: int) -> None:
        """A rollback: every worker (or the next round) goes back to ``step``."""

    def evaluate(self, iteration: int, progress: dict[str, Progress],
                 logical: int | None = None) -> bool:
        """Score the current parameters at ``iteration``; True: the target is reached."""

    def extras(self, progress: dict[str, Progress], logical: int) -> dict[str, Any]:
        """What every evaluation records besides the metric."""

    def started_training(self) -> None:
        """An update was seen applied: the start-up is over (recorded once)."""

    def report_spares(self) -> None:
        """An event for each spare started after a failure that is ready now."""

    def finish(self, iteration: int, progress: dict[str, Progress]) -> RunResult:
        """The run's result at its end (``iteration`` executed)."""
