"""The last resort against a run that waits forever: no update acknowledged for long.

Every wait of the driver is bounded, and a failure is handled once seen; but a run
whose workers retry a shard that never comes back (a chain that cannot be rebuilt, a
coordinator that keeps losing its sessions) would otherwise go on until someone kills
it. Here the driver ends such a run with the reason, after ``STALL_SECONDS`` without a single
acknowledged update, plus the configured recovery delay (a shard down on purpose).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from trainthrough.errors import RunStalled

if TYPE_CHECKING:
    from trainthrough.engines.ray.actors.reports import Progress
    from trainthrough.engines.ray.driver.recovery import Replacement

# Far above any step here (cnn: ~10 ms; a recovery: seconds), far below "forever".
STALL_SECONDS = 120.0


class StallWatch:
    """Raises :class:`RunStalled` from :meth:`check` once acknowledged updates stop."""

    def __init__(self, recovery_delay: float,
                 pending: Callable[[], Sequence[Replacement]],
                 limit: float = STALL_SECONDS) -> None:
        self.limit = limit + max(recovery_delay, 0.0)
        self.pending = pending
        self._count = -1
        self._since = time.perf_counter()

    def check(self, progress: dict[str, Progress], iteration: int) -> None:
        count = sum(p["pushes"] for p in progress.values())
        now = time.perf_counter()
        if count != self._count:
            self._count, self._since = count, now
            return
        if now - self._since <= self.limit:
            return
        waiting = ", ".join(f"{p.kind} {p.member.name} (for {p.dead.name})"
                            for p in self.pending()) or "none"
        raise RunStalled(f"no update acknowledged for {now - self._since:.0f} s (iteration "
                         f"{iteration}, {count} updates); replacements pending: {waiting}")
