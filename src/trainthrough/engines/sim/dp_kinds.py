"""The failure kinds beside a crash, on the virtual clock: a notice, a pause, a slow rank,
a partition.

:class:`~trainthrough.engines.sim.dp_recovery.SimDPRecovery` hands every due failure
of these modes here; this module keeps what they leave behind and says what the group
pays, as the gloo engine's controller does with real processes (docs/strategies.md,
"Paused and slow ranks", "Preemption"):

- ``preempt:<notice>``: a notice, not a death. The rank trains on and leaves at the
  end of the step it is in (:meth:`SimKinds.leaving`, a relaxed sync: after an outer
  step that synchronized every fragment): nothing is rolled back or redone. If the
  clock passes its notice first, it is struck there like a crash (``preempt-expired``).
- ``pause:<duration>``: shorter than the collective timeout (``cost.timeout_seconds``),
  the group waits for it at its next collective: the pause is charged on the clock and
  nothing else happens. Longer, its peers give up at the timeout: a lost rank, fenced
  (``rank-fenced``, ``no-report``); when the pause ends the woken incarnation finds
  itself out and leaves (``pause-ended`` with ``member: false``).
- ``partition:<duration>``: the ranks named are cut off from the controller's side,
  alive. To the group a cut is a pause it cannot tell apart: shorter than the
  collective timeout, the group waits it out (``partition-healed``, ``member: true``);
  longer, its peers give up at the timeout and the cut-off ranks are fenced
  (``no-report``) and recovered as lost, while they live on, computing a step they can
  never commit (no group forms without the controller's plan). When the cut heals,
  each sends the report of that step, refused (``write-refused``), finds itself out and
  leaves (``partition-healed``, ``member: false``). The ranks of one spec are cut
  together: the group waits once, not once per rank.
- ``slow:<F>x``: from its trigger on, the rank's compute takes F times as long and a
  synchronous group waits for it at each step's first collective. With a straggler
  deadline the members wait at most that long there; who did not come by then is
  dropped (:class:`~trainthrough.ft.dp_policies.StragglerPolicy` decides, from each
  member's wait), fenced (``straggler``) and recovered as a lost rank; its replacement
  runs at full speed (the slow order is spent with the process).

Incarnations count the processes a slot has had (0 the first, as on gloo), so the
fencing events name the same (slot, incarnation) pairs gloo's do.
"""

from __future__ import annotations

from collections.abc import Callable

from trainthrough.dp.batching import StepBatch
from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.events import (
    Event,
    PartitionHealed,
    PauseEnded,
    PreemptExpired,
    PreemptNotice,
    RankFenced,
    WriteRefused,
)
from trainthrough.faults.schedule import FailureEvent
from trainthrough.ft.dp_policies import StragglerPolicy


class SimKinds:
    """Notices, pauses, cuts and slow-downs of the ranks of one simulated data-parallel run."""

    def __init__(self, size: int, clock: VirtualClock, costs: Costs,
                 emit: Callable[[Event], None], deadline: float | None) -> None:
        self.clock, self.costs, self.emit = clock, costs, emit
        self.stragglers = StragglerPolicy(deadline)
        self.inc = dict.fromkeys(range(size), 0)  # slot -> its current incarnation
        self.notices: dict[int, tuple[float, float]] = {}  # slot -> (runs out at, notice)
        self.slow: dict[int, float] = {}  # slot -> its slow-down factor
        # Pauses and cuts the group gave up on: (slot, incarnation, when it went silent,
        # when it is back, its mode).
        self._asleep: list[tuple[int, int, float, float, str]] = []
        # The event whose ranks the group is waiting out, and since when: the ranks of
        # one spec are paused or cut together, and waited for once.
        self._held: tuple[FailureEvent, float] | None = None
        self.drained = 0  # ranks that left with a notice
        self.refused = 0  # what fenced ranks sent after their cut healed

    # -- a failure of one of these kinds is due -----------------------------------------
    def deliver(self, e: FailureEvent, slot: int, logical: int) -> bool:
        """Deliver ``e`` to live ``slot``; whether the rank is lost by it now (a pause
        or cut longer than the collective timeout: its peers find it at the timeout)."""
        now = self.clock.now
        if e.mode == "preempt":
            assert e.notice is not None
            self.notices[slot] = (now + e.notice, e.notice)
            self.emit(PreemptNotice(slot=slot, logical=logical, source="injected",
                                    spec=e.spec, notice_seconds=e.notice))
            return False
        if e.mode == "slow":
            assert e.slow_factor is not None
            self.slow[slot] = e.slow_factor
            return False
        seconds = e.cut_seconds if e.mode == "partition" else e.pause_seconds
        assert e.mode in ("pause", "partition") and seconds is not None, e.mode
        if seconds < self.costs.m.timeout_seconds:
            # Its peers wait for it at their next collective, no longer than it is away.
            if self._held is None or self._held[0] is not e:
                self._held = (e, now)
            self.clock.advance(max(0.0, self._held[1] + seconds - self.clock.now))
            self.emit(self._back(e.mode, slot, self.inc[slot], seconds, member=True))
            return False
        self._asleep.append((slot, self.inc[slot], now, now + seconds, e.mode))
        return True

    @staticmethod
    def _back(mode: str, slot: int, inc: int, seconds: float, member: bool) -> Event:
        if mode == "partition":
            return PartitionHealed(slot=slot, inc=inc, cut_seconds=seconds, member=member)
        return PauseEnded(slot=slot, inc=inc, paused_seconds=seconds, member=member)

    def expired(self, live: list[int]) -> list[int]:
        """Live ranks whose notice ran out before they left: SIGKILLed now, a crash.
        Also says which fenced pauses and cuts ended by now (``pause-ended``,
        ``partition-healed``: not a member; a cut-off rank's report refused)."""
        now = self.clock.now
        for slot, inc, stopped, due, mode in [p for p in self._asleep if p[3] <= now]:
            if mode == "partition":  # it reports the step it was in: too late, fenced
                self.emit(WriteRefused(slot=slot, inc=inc, message="report"))
                self.refused += 1
            self.emit(self._back(mode, slot, inc, due - stopped, member=False))
        self._asleep = [p for p in self._asleep if p[3] > now]
        out = [s for s in live if s in self.notices and self.notices[s][0] <= now]
        for s in out:
            self.emit(PreemptExpired(slot=s, notice_seconds=self.notices[s][1]))
        return out

    # -- what a step costs, and who misses the deadline ---------------------------------
    def arrivals(self, batch: StepBatch, micro_seconds: float) -> dict[int, float]:
        """Each live rank's compute this step (its micro-batches, times its slow-down):
        when it reaches the step's first collective, from the step's start."""
        return {s: micro_seconds * len(share) * self.slow.get(s, 1.0)
                for s, share in batch.share.items()}

    def first_collective(self, arrivals: dict[int, float]) -> tuple[float, tuple[int, ...]]:
        """When the first collective of the step starts (from the step's start) and the
        members dropped for missing the deadline there (the policy decides from each
        member's wait; without a deadline nobody is, and the group waits for the last)."""
        last = max(arrivals.values())
        deadline = self.stragglers.deadline
        if deadline is None or last <= min(arrivals.values()) + deadline:
            return last, ()
        # The first to come waits the deadline out and the collective breaks for all:
        # who came before waited until then; who came after found it closed (0 s).
        broke = min(arrivals.values()) + deadline
        waited = {s: max(0.0, broke - a) if a <= broke else 0.0 for s, a in arrivals.items()}
        return broke, self.stragglers.decide(waited)

    # -- membership ---------------------------------------------------------------------
    def fence(self, silent: tuple[int, ...], late: tuple[int, ...]) -> None:
        """Take the current incarnations of these ranks out of the group (presumed
        failed): the silent ones (hung, paused) and the late ones (stragglers)."""
        for s in silent:
            self.emit(RankFenced(slot=s, inc=self.inc[s], reason="no-report"))
        for s in late:
            self.emit(RankFenced(slot=s, inc=self.inc[s], reason="straggler"))

    def leaving(self, live: list[int]) -> list[int]:
        """The live ranks with a notice: they leave at this step boundary."""
        return [s for s in live if s in self.notices]

    def gone(self, slots: list[int] | tuple[int, ...]) -> None:
        """These ranks left or were lost: their notice and slow-down went with them."""
        for s in slots:
            self.notices.pop(s, None)
            self.slow.pop(s, None)

    def joined(self, slots: list[int]) -> None:
        """New processes took these slots (a replacement; a restart: every slot)."""
        for s in slots:
            self.inc[s] = self.inc.get(s, -1) + 1
        self.gone(slots)
