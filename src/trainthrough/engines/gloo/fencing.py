"""Fencing: the rank incarnations the controller took out of the group, and what it
refuses from them.

A rank process is incarnation ``inc`` of its slot for its whole life; its token
``[slot, inc]`` travels with every message it posts and every report it writes
(:func:`~.protocol.sign`), and every plan names the incarnations of its members
(``Plan.incs``). The controller takes a process out of the group while it may still
run when:

- its heartbeat stopped (``silent``): it is also SIGKILLed, so that peers blocked with
  it in a collective fail at once, but a kill may not land (a process on another host,
  out of reach) and the fence does not depend on it;
- it did not report when its group broke (``no-report``): a paused or hung rank, which
  its peers have left already. It is not killed: a pause may end, and the rank then
  finds itself out and leaves (a stop that lasts is ended by the liveness timeout);
- it missed the straggler deadline (``straggler``): alive and behind, it leaves and a
  replacement takes its slot;
- its end was reported and the group went on without it (``lost``): an end the
  controller did not see itself may be no end at all. Ray reports the actors of a node
  it dropped as dead when the node is only cut off (a partition): they run on, out of
  reach, and write again once the network heals. Fenced after the last drain of the
  queue before the group re-forms, so what a process that really died posted before
  it died is read first.

From then on every message and report of that incarnation is refused, unread, and
recorded as a ``write-refused`` event: its evaluations, checkpoint reports, failure and
exit messages (whose replica hash and commits would otherwise stand for its slot's
replacement) never count. It cannot contribute a gradient to a step of a group it is
not in either: each attempt forms its gloo group among the plan's members on a store
prefix of its own, and the group it was in is closed by the peers that left it; the
next plan it reads names another incarnation of its slot, or none, and it retires.

Plain sets, no clock, no processes: what the controller decides is tested alone.
"""

from __future__ import annotations

from collections.abc import Callable

from trainthrough.events import Event, RankFenced, WriteRefused

#: Why an incarnation was fenced (the ``rank-fenced`` event's ``reason``).
REASONS = ("silent", "no-report", "straggler", "lost")


class Fences:
    """The revoked tokens of one run, and the count of writes refused because of them."""

    def __init__(self, emit: Callable[[Event], None]) -> None:
        self._emit = emit
        self._out: set[tuple[int, int]] = set()
        self._told: set[tuple[int, int, str]] = set()  # refusals recorded once each
        self.refused = 0

    def revoke(self, slot: int, inc: int, reason: str) -> None:
        """Take incarnation ``inc`` of ``slot`` out of the group, for good (once)."""
        assert reason in REASONS, reason
        if (slot, inc) not in self._out:
            self._out.add((slot, inc))
            self._emit(RankFenced(slot=slot, inc=inc, reason=reason))

    def out(self, slot: int, inc: int) -> bool:
        """Whether incarnation ``inc`` of ``slot`` was fenced."""
        return (slot, inc) in self._out

    def refuses(self, sender: list[int] | None, what: str, key: str | None = None) -> bool:
        """Whether a write signed ``sender`` (``[slot, inc]``) must be refused: it comes
        from a fenced incarnation. Each refusal is counted and recorded, once per
        ``key`` where the same write is seen again (a report read on every tick).
        Unsigned writes (a process that never signed: none of this run's ranks) pass."""
        if sender is None or len(sender) != 2:
            return False
        slot, inc = int(sender[0]), int(sender[1])
        if (slot, inc) not in self._out:
            return False
        self.refuse(slot, inc, what, key)
        return True

    def refuse(self, slot: int, inc: int, what: str, key: str | None = None) -> None:
        """Count and record a write of incarnation ``inc`` of ``slot`` refused (a fenced
        one's, or one no longer its slot's), once per ``key`` if given."""
        seen = (slot, inc, key or "")
        if key is None or seen not in self._told:
            self._told.add(seen)
            self.refused += 1
            self._emit(WriteRefused(slot=slot, inc=inc, message=what))
