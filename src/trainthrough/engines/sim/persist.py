"""How a checkpoint write spends simulated time, sync or in the background.

Shared by the parameter-server and data-parallel checkpointers, which differ in
what they save, not in how saving costs time. Sync: training blocks for
``bytes / storage_bandwidth``. Async: it blocks only for an in-memory snapshot
(``bytes / memory_bandwidth``) and the write completes ``bytes / storage_bandwidth``
later, when :meth:`Persister.flush_due` runs it. A second write never overlaps the
first (it waits, and the wait is charged as blocked); a failure can abandon the write
in flight (:meth:`Persister.drop`), so recovery never sees a checkpoint that was not
complete before the crash.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainthrough.engines.sim.clock import Costs, VirtualClock

Finish = Callable[[float], None]  # does the write; gets the seconds training was blocked


class Persister:
    """Times checkpoint writes on the virtual clock; ``blocked`` sums the stalls."""

    def __init__(self, clock: VirtualClock, costs: Costs) -> None:
        self.clock, self.costs = clock, costs
        self.blocked = 0.0
        # (simulated end of the write, who writes it, the write itself)
        self._pending: tuple[float, Any, Finish] | None = None

    def write(self, nbytes: int, asynchronous: bool, finish: Finish, owner: Any = None) -> None:
        """Carry out one write of ``nbytes``, now (sync) or when its time is up (async)."""
        if not asynchronous:
            blocked = self.costs.storage(nbytes)
            self.clock.advance(blocked)
            self.blocked += blocked
            finish(blocked)
            return
        wait = 0.0
        if self._pending is not None:  # never two writes at once: wait for the first
            wait = max(0.0, self._pending[0] - self.clock.now)
            self.clock.advance(wait)
            self.flush_due()
        snap = nbytes / self.costs.m.memory_bandwidth
        self.clock.advance(snap)
        self.blocked += wait + snap
        self._pending = (self.clock.now + self.costs.storage(nbytes), owner,
                         lambda _: finish(wait + snap))

    def flush_due(self) -> None:
        """Complete a background write whose simulated time is up."""
        if self._pending is not None and self._pending[0] <= self.clock.now:
            finish = self._pending[2]
            self._pending = None
            finish(0.0)  # the write's own stall was bound in when it started

    def drop(self, owner: Any = None) -> bool:
        """Abandon the write in flight (only ``owner``'s, when given); True if one was."""
        if self._pending is None or (owner is not None and self._pending[1] != owner):
            return False
        self._pending = None
        return True
