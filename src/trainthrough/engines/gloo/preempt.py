"""Preemption on the controller's side: ranks that got their notice, and the job's own.

A preempted rank is not a failed one. It got SIGTERM (:mod:`.notice`) some seconds
before its end, keeps training, and leaves once its group stopped after a step: the
step it was in is committed, nothing is rolled back or redone, and the group goes on
smaller (the elastic policy sizes its batch) until a replacement joins
(:class:`~.recovery.DistRecovery` carries it out). :class:`Drains` is its bookkeeping:
which processes have a notice, when an injected one's notice runs out (then the
controller SIGKILLs the rank, as the cloud would, and its loss is recovered like a
crash), and which processes left (their end is no failure, whatever its code).

:class:`JobNotice` is the whole job's notice: SIGTERM to the controller's process. It
is noted, not raised where it lands, so the controller acts on it at a safe point of
its loop: the group stops after a step, a live member writes a just-in-time
checkpoint (a ``stop`` plan with ``save``), and only then does the job end as the
signal's own handler ends it (the command line's: ``interrupted``, resumable).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from types import FrameType

from trainthrough.engines.gloo.messages import Noticed
from trainthrough.engines.gloo.procs import Proc
from trainthrough.errors import Terminated


@dataclass
class Notice:
    """Process ``proc`` got its notice; ``deadline``: when the controller SIGKILLs it if
    it is still there (an injected preemption; None: the sender of an outside SIGTERM
    does, if anyone)."""

    proc: Proc
    message: Noticed
    deadline: float | None


class Drains:
    """The notices of the run's rank processes: those of members still to leave, by
    slot, and those of processes that left (kept until an injected one's SIGKILL)."""

    def __init__(self) -> None:
        self.notices: dict[int, Notice] = {}  # slot -> the notice of a process to drain
        self._left: list[Notice] = []  # processes that left their group: no failure
        self.drained = 0  # ranks that left with a notice

    def add(self, p: Proc, m: Noticed) -> Notice:
        n = Notice(p, m, m.t + m.notice_seconds if m.notice_seconds is not None else None)
        self.notices[p.slot] = n
        return n

    def leaving(self, members: list[int]) -> list[int]:
        """The members whose process has a notice (a replacement that took a drained
        slot has none: the notice went with the process that left)."""
        return [s for s in members if s in self.notices]

    def left(self, slots: list[int]) -> None:
        """These ranks left their group: whatever ends their processes now is no failure
        (an injected notice's SIGKILL still comes if they linger)."""
        self._left += [self.notices.pop(s) for s in slots]
        self.drained += len(slots)

    def gone(self, p: Proc) -> bool:
        return any(p is n.proc for n in self._left)

    def expired(self, now: float) -> list[Notice]:
        """Notices that ran out, each once, of processes still running."""
        every = [*self.notices.values(), *self._left]
        out = [n for n in every
               if n.deadline is not None and n.deadline <= now and n.proc.exitcode is None]
        for n in out:
            n.deadline = None
            # Killed and recovered as a crash from here: its slot is no longer leaving
            # (its replacement, which may be ready before the kill's exit is seen, has no
            # notice).
            if self.notices.get(n.proc.slot) is n:
                del self.notices[n.proc.slot]
        for s in [s for s, n in self.notices.items() if n.proc.exitcode is not None]:
            del self.notices[s]  # ended before it left: its death is handled as one
        return out


class JobNotice:
    """SIGTERM to this (the controller's) process while a run is supervised: noted in
    :attr:`given`, then :meth:`end` ends the job as the handler it replaced would have.
    Installed only in the main thread, and not where SIGTERM is ignored."""

    def __init__(self) -> None:
        self.given: float | None = None
        self._old: signal.Handlers | object | None = None

    def install(self) -> None:
        """Take SIGTERM over (in the main thread, unless it is ignored)."""
        if threading.current_thread() is threading.main_thread():
            old = signal.getsignal(signal.SIGTERM)
            if old is not signal.SIG_IGN:
                self._old = signal.signal(signal.SIGTERM, self._on)

    def _on(self, signum: int, frame: FrameType | None) -> None:
        if self.given is None:
            self.given = time.time()

    def restore(self) -> object | None:
        """Give SIGTERM back to the handler it had; that handler (None: not installed)."""
        old, self._old = self._old, None
        if old is not None:
            signal.signal(signal.SIGTERM, old)  # type: ignore[arg-type]
        return old

    def end(self) -> None:
        """Leave as the SIGTERM would have: its old handler (the command line's raises
        :class:`~trainthrough.errors.Terminated`), else :class:`Terminated`.

        Raises:
            Terminated: (or whatever the old handler raises).
        """
        old = self.restore()
        if callable(old):
            old(signal.SIGTERM, None)
        raise Terminated()
