"""When a failure nobody injected is a bug: the restart budget of a data-parallel run.

A rank process that is lost without a failure order of the run (the user's code
raised, the process was killed behind the run's back, it was presumed hung, its
heartbeat stopped) is a failure like an injected one, and the strategy recovers it:
transient causes (a flaky read, a process the OOM killer picked) go away. One that
repeats the same way, the same error with the run no further than before, is a bug that
no recovery will get past: :class:`CrashLoopPolicy` lets the run recover it
``max_restarts`` times in a row, then ends the run with that error (as Ray Train's
``FailureConfig.max_failures`` and torchrun's ``--max-restarts`` bound their restarts,
here only for a failure that makes no progress).

"No further": the furthest step the run has committed, when the failure struck, is
the same as at the last one. Not the step it struck at: a restart may strike at step
25 every time, and a survivor that goes on alone may commit one step more before it
fails the same way (a model too large for a message: the first rank dies posting it,
the survivor takes its place, gets one step further and dies posting it too, the
group restarts): the run is stuck all the same.

"In a row": the controller keeps the streak, the failures nobody injected since the
run started, newest last, and asks :meth:`CrashLoopPolicy.decide` with each new one. A
failure with another error, or after the run got further, starts a new streak; an
injected failure is neither counted nor breaks it. Pure: no clock, no process.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Unexpected:
    """A failure nobody injected: ``error`` in one line, as the rank said it
    (``ValueError: boom``) or as its process ended (``exit code 1``); ``furthest``: the
    most steps the run had committed when it struck (its progress)."""

    error: str
    furthest: int


class CrashAction(enum.Enum):
    """What the run does about a failure nobody injected."""

    RECOVER = "recover"  # as the strategy recovers any failure
    GIVE_UP = "give-up"  # end the run with the failure's error


@dataclass(frozen=True)
class CrashDecision:
    """``times``: how often in a row the run failed this way, this failure included."""

    action: CrashAction
    times: int


@dataclass(frozen=True)
class CrashLoopPolicy:
    """Recover a failure that repeats the same way ``max_restarts`` times in a row."""

    max_restarts: int

    def decide(self, streak: Sequence[Unexpected], failure: Unexpected) -> CrashDecision:
        """The decision on ``failure``, after the unexpected failures ``streak`` (oldest
        first; ``failure`` not among them)."""
        times = 1
        for before in reversed(streak):
            if before != failure:
                break
            times += 1
        give_up = times > self.max_restarts
        return CrashDecision(CrashAction.GIVE_UP if give_up else CrashAction.RECOVER, times)
