"""The losses nobody injected, as the ``dist`` controller accounts for them.

A rank lost without a failure order of the run (its code raised, its process was
killed behind the run's back, it was presumed hung, its heartbeat stopped) is
recovered as any failure is, until it repeats the same way: the shared
:class:`~trainthrough.ft.crash_loop.CrashLoopPolicy` decides, :class:`Crashes` keeps
the streak it decides on and what each rank process said of its end (its
:class:`~.messages.RankError`), and raises :class:`~trainthrough.errors.RankFailed`
when the run must end: one line, the rank's own error first. The traceback is
recorded as a ``rank-error`` event (events.jsonl) when the rank posts it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainthrough.engines.gloo.messages import RankError
from trainthrough.errors import RankFailed
from trainthrough.events import RankErrored
from trainthrough.ft.crash_loop import CrashAction, CrashLoopPolicy, Unexpected

if TYPE_CHECKING:
    from trainthrough.engines.gloo.procs import Proc


@dataclass(frozen=True)
class Cause:
    """Why one rank process was lost: ``error`` in one line; ``type_name`` and
    ``message`` of the exception it raised (empty: it ended without one);
    ``logical``: its committed steps then (-1: unknown)."""

    slot: int
    error: str
    type_name: str = ""
    message: str = ""
    logical: int = -1


class Crashes:
    """The rank errors of the run, and the streak of losses nobody injected."""

    def __init__(self, max_restarts: int) -> None:
        self.policy = CrashLoopPolicy(max_restarts)
        self.errors: dict[tuple[int, int], RankError] = {}  # (slot, incarnation)
        self.streak: list[Unexpected] = []  # the same failure, repeated: oldest first
        self.furthest = 0  # the most steps the run was seen to commit

    def on_error(self, m: RankError) -> RankErrored:
        """A rank process posted its error (it exits right after); the event to record."""
        self.errors[(m.slot, m.inc)] = m
        return RankErrored(slot=m.slot, error=m.error, logical=m.logical,
                           traceback=m.traceback)

    def cause(self, p: Proc, hung: bool = False) -> Cause:
        """What ended ``p``, as well as the controller knows: its own error, else how
        its process ended. ``hung``: the controller ended it for not reporting."""
        m = self.errors.get((p.slot, p.inc))
        if m is not None:
            return Cause(p.slot, m.error, m.type_name, m.message, m.logical)
        if p.silent_since is not None:
            return Cause(p.slot, "its heartbeat stopped (the process was stopped or frozen)")
        if hung:
            return Cause(p.slot, "hung: it did not report after its group broke")
        return Cause(p.slot, _ended(p))

    def judge(self, causes: list[Cause], step: int) -> None:
        """Count one loss nobody injected (``causes``: the ranks lost, at least one;
        ``step``: the committed steps of the group, as its survivors or the last
        evaluation said).

        Raises:
            RankFailed: it is the same failure, the run no further than at the last,
                one time more than ``max_restarts`` allows in a row.
        """
        first = min(causes, key=lambda c: (not c.type_name, c.slot))  # an error says most
        at = first.logical if first.logical >= 0 else step
        self.furthest = max([self.furthest, step, *(c.logical for c in causes)])
        failure = Unexpected(first.error, self.furthest)
        d = self.policy.decide(self.streak, failure)
        if self.streak and self.streak[-1] != failure:
            self.streak = []
        self.streak.append(failure)
        if d.action is CrashAction.GIVE_UP:
            where = "; its traceback is in events.jsonl" if first.type_name else ""
            times = f"{d.times} time{'s' if d.times != 1 else ''} in a row"
            raise RankFailed(f"rank {first.slot}: {first.error} (at step {at}; {times}, "
                             f"never past step {self.furthest}; max_restarts "
                             f"{self.policy.max_restarts}{where})",
                             first.slot, first.type_name, first.message, at, d.times)

    def fatal(self, p: Proc, where: str) -> RankFailed:
        """The error that ends the run when ``p`` is lost where nothing recovers it
        (while the ranks start, or a replacement before it joined)."""
        c = self.cause(p)
        extra = "; its traceback is in events.jsonl" if c.type_name else ""
        return RankFailed(f"rank {p.slot} {where}: {c.error}{extra}", p.slot, c.type_name,
                          c.message, c.logical, 1)


def _ended(p: Proc) -> str:
    code = p.exitcode
    why = getattr(p.process, "why", "")  # what Ray said of an actor's end
    if code is None:
        said = "it was lost"
    elif code < 0:
        try:
            said = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            said = f"killed by signal {-code}"
    else:
        said = f"its process ended with exit code {code}"
    return f"{said} ({why})" if why else said
