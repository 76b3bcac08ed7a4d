"""From failure specs to concrete, seeded failure events.

A schedule is resolved once per run from the specs, the run's sizes and the seed:
fractions and ``any`` pick ids with the schedule's own generator, MTBF specs draw
exponential inter-arrival times. The engine then asks :meth:`FailureSchedule.due`
at each point where a failure may strike; an event fires once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainthrough.faults.spec import FailureSpec

# Random failures stop being drawn past this many per spec unless ``max=`` says.
_MTBF_CAP = 1000


@dataclass(frozen=True)
class FailureEvent:
    """A failure to deliver: which components, when, in which phase, how."""

    kind: str
    ids: tuple[int, ...]
    at_iter: int | None
    at_time: float | None
    phase: str | None
    mode: str
    spec: str
    replica: int | None = None  # chain position to kill (0 = head); real engines only


class FailureSchedule:
    """The resolved failures of one run, fired in order of their trigger."""

    def __init__(self, specs: list[FailureSpec], sizes: dict[str, int], seed: int) -> None:
        self._rng = np.random.RandomState((seed * 2_654_435_761 + 97) % 2**32)
        self.sizes = sizes
        self.pending: list[FailureEvent] = []
        for s in specs:
            self.pending.extend(self._expand(s))
        self.fired: list[FailureEvent] = []

    def _pick(self, s: FailureSpec) -> tuple[int, ...]:
        n = self.sizes[s.kind]
        if s.ids:
            return s.ids
        if s.every:
            return tuple(range(n))
        if s.fraction is not None:
            k = min(n, max(1, int(round(s.fraction * n))))
            return tuple(sorted(int(i) for i in self._rng.choice(n, size=k, replace=False)))
        return (int(self._rng.randint(n)),)

    def _expand(self, s: FailureSpec) -> list[FailureEvent]:
        if s.mtbf is None:
            return [FailureEvent(s.kind, self._pick(s), s.at_iter, s.at_time, s.phase,
                                 s.mode, s.text, s.replica)]
        out, t = [], 0.0
        for _ in range(s.max_count if s.max_count is not None else _MTBF_CAP):
            t += float(self._rng.exponential(s.mtbf))
            at_iter = max(1, int(round(t))) if s.mtbf_unit == "iter" else None
            at_time = t if s.mtbf_unit == "s" else None
            out.append(FailureEvent(s.kind, self._pick(s), at_iter, at_time, s.phase,
                                    s.mode, s.text, s.replica))
        return out

    def due(self, iteration: int, seconds: float, phase: str | None = None,
            kinds: tuple[str, ...] | None = None) -> list[FailureEvent]:
        """Pop the events whose trigger has passed and whose phase is ``phase``.

        An event with a phase waits for a call naming that phase (a ``recovery``
        failure waits for the next recovery in progress).
        """
        fire, keep = [], []
        for e in self.pending:
            hit = ((e.at_iter is not None and iteration >= e.at_iter)
                   or (e.at_time is not None and seconds >= e.at_time))
            ok_kind = kinds is None or e.kind in kinds
            (fire if hit and e.phase == phase and ok_kind else keep).append(e)
        self.pending = keep
        self.fired.extend(fire)
        return fire

    def next_time(self) -> float | None:
        """The earliest pending time trigger (engines use it to cut idle waits)."""
        times = [e.at_time for e in self.pending if e.at_time is not None]
        return min(times) if times else None
