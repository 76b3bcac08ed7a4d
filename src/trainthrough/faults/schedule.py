"""From failure specs to concrete, seeded failure events.

A schedule is resolved once per run from the specs, the run's sizes and the seed:
fractions and ``any`` pick ids with the schedule's own generator, MTBF specs draw
exponential inter-arrival times. The engine then asks :meth:`FailureSchedule.due`
at each point where a failure may strike; an event fires once.

Random (MTBF) failures are drawn lazily, one event ahead per spec: a run only ever
draws the failures it reaches, so ``max=100000`` costs nothing up front. Each MTBF
spec has its own generator, seeded by (run seed, position of the spec), so its events
are the same whether they are drawn early, late, or all at once (:attr:`pending`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from trainthrough.faults.spec import FailureSpec, picked

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
    pause_seconds: float | None = None  # mode=pause: how long it stays stopped
    slow_factor: float | None = None  # mode=slow: a step takes this many times its compute
    notice: float | None = None  # mode=preempt: seconds from the notice to the SIGKILL
    cut_seconds: float | None = None  # mode=partition: how long the ranks are cut off


def _pick(s: FailureSpec, n: int, rng: np.random.RandomState) -> tuple[int, ...]:
    if s.ids:
        return s.ids
    if s.every:
        return tuple(range(n))
    if s.fraction is not None:
        return tuple(sorted(int(i) for i in rng.choice(n, size=picked(s, n), replace=False)))
    return (int(rng.randint(n)),)


def _event(s: FailureSpec, ids: tuple[int, ...], at_iter: int | None,
           at_time: float | None) -> FailureEvent:
    return FailureEvent(s.kind, ids, at_iter, at_time, s.phase, s.mode, s.text, s.replica,
                        s.pause_seconds, s.slow_factor, s.notice, s.cut_seconds)


class _Stream:
    """The events of one spec in trigger order; ``head`` is the next one (None: done).

    A one-shot spec is a stream of one event. An MTBF stream draws its next event
    only when the head is taken, so its times are non-decreasing and, since every
    event of a spec shares its kind and phase, the head is the only one that can be
    due when the rest are not.
    """

    def __init__(self, spec: FailureSpec, n: int, rng: np.random.RandomState | None,
                 first: FailureEvent | None = None) -> None:
        self.spec, self.n, self.rng = spec, n, rng
        self.left = (0 if first is not None else
                     spec.max_count if spec.max_count is not None else _MTBF_CAP)
        self.t = 0.0
        self.head = first if first is not None else self._draw()

    def _draw(self) -> FailureEvent | None:
        if self.left == 0 or self.rng is None or self.spec.mtbf is None:
            return None
        self.left -= 1
        self.t += float(self.rng.exponential(self.spec.mtbf))
        per_iter = self.spec.mtbf_unit == "iter"
        return _event(self.spec, _pick(self.spec, self.n, self.rng),
                      max(1, int(round(self.t))) if per_iter else None,
                      None if per_iter else self.t)

    def pop(self) -> FailureEvent:
        event, self.head = self.head, self._draw()
        assert event is not None
        return event

    def rest(self) -> list[FailureEvent]:
        """Every event not yet taken, drawn on a copy so this stream is unchanged."""
        other, out = copy.deepcopy(self), []
        while other.head is not None:
            out.append(other.pop())
        return out


class FailureSchedule:
    """The resolved failures of one run, fired in order of their trigger."""

    def __init__(self, specs: list[FailureSpec], sizes: dict[str, int], seed: int) -> None:
        base = (seed * 2_654_435_761 + 97) % 2**32
        # One-shot picks share one generator, in spec order; each MTBF spec draws from
        # its own, so lazily drawn events cannot shift another spec's picks.
        self._rng = np.random.RandomState(base)
        self.sizes = sizes
        self._streams: list[_Stream] = []
        for i, s in enumerate(specs):
            n = sizes[s.kind]
            if s.mtbf is None:
                first = _event(s, _pick(s, n, self._rng), s.at_iter, s.at_time)
                self._streams.append(_Stream(s, n, None, first))
            else:
                self._streams.append(_Stream(s, n, np.random.RandomState([base, i + 1])))
        self.fired: list[FailureEvent] = []

    @property
    def pending(self) -> list[FailureEvent]:
        """Every event not fired yet, in spec order, random ones drawn out to their ``max``.

        For callers that hand the whole schedule over up front (the ``dist`` engine's
        orders); engines that ask :meth:`due` never draw more than they reach.
        """
        return [e for st in self._streams for e in st.rest()]

    def due(self, iteration: int, seconds: float, phase: str | None = None,
            kinds: tuple[str, ...] | None = None) -> list[FailureEvent]:
        """Pop the events whose trigger has passed and whose phase is ``phase``.

        An event with a phase waits for a call naming that phase (a ``recovery``
        failure waits for the next recovery in progress).
        """
        fire = []
        for st in self._streams:
            while (e := st.head) is not None and e.phase == phase \
                    and (kinds is None or e.kind in kinds) \
                    and ((e.at_iter is not None and iteration >= e.at_iter)
                         or (e.at_time is not None and seconds >= e.at_time)):
                fire.append(st.pop())
        self.fired.extend(fire)
        return fire

    def skip_through(self, iteration: int) -> list[FailureEvent]:
        """Drop (and return) every event whose iteration trigger is at or before
        ``iteration``, whatever its phase: a resumed run delivered them before."""
        skipped = []
        for st in self._streams:
            while (e := st.head) is not None and e.at_iter is not None and e.at_iter <= iteration:
                skipped.append(st.pop())
        return skipped

    def next_time(self) -> float | None:
        """The earliest pending time trigger (engines use it to cut idle waits)."""
        times = [st.head.at_time for st in self._streams
                 if st.head is not None and st.head.at_time is not None]
        return min(times) if times else None
