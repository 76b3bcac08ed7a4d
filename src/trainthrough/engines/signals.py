"""The one way the project signals a process: only a known, live descendant of ours.

A failure injector that sends SIGKILL to the wrong pid is the most dangerous defect a
fault-tolerance tool can have: ``os.kill(0, SIGKILL)`` kills the caller's whole process
group, and a pid recorded long ago may by now belong to someone else. So every signal
the project sends goes through :func:`send`, which acts only when all of these hold:

* the target was *identified* while alive (:func:`identify`): its pid together with its
  start time (``/proc/<pid>/stat`` field 22), so a reused pid is never mistaken for it;
* the pid is a real process id (> 1), not this process, and not a process group;
* the process is still the same one (same start time) and still a descendant of this
  process (its parent chain reaches ``os.getpid()``): a process we (or a runtime we
  started, like a local Ray) created.

Anything else is refused with :class:`SignalRefused`, never delivered. Processes on
another machine (a Ray cluster we joined) are not ours to signal: their engines stop
them through the runtime's own API instead.

A process this project starts itself is *pinned* instead (:func:`pin` for a child,
:func:`adopt` for a rank the zygote forked and opened a pidfd for): a pidfd obtained
while the process is known to be ours keeps referring to that very process for as long
as it is held, whoever its parent becomes. A rank forked by the
zygote stops being our descendant when the zygote dies first (a ``timeout`` or a
terminal sends SIGTERM to the whole process group; the ranks are left to init): it is
still the process this run started, and its :class:`Pinned` handle still reaches it,
never another process that took its pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import OrderedDict
from dataclasses import dataclass

#: pids of the processes that died of a failure this project injected, newest last,
#: at most ``_KEEP``: the ones :func:`send` signalled and the ranks that carried out
#: their own failure order (:func:`note_injected`). A runtime that reports one of them
#: as an unexpected death is reporting that failure (engines/ray/runtime.py keeps Ray
#: from blaming the OOM killer for it)
_injected: OrderedDict[int, None] = OrderedDict()
_KEEP = 4096
#: guards ``_injected`` and wakes :func:`injected`'s waiters (a runtime's own thread)
_noted = threading.Condition()


class SignalRefused(Exception):
    """The target is not a live descendant this project identified; nothing was sent."""


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as seen when it was identified: pid plus kernel start time."""

    pid: int
    start_ticks: int


def _fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (the state) on, or None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    rest = text[text.rfind(")") + 2:].split()
    return rest if len(rest) >= 20 else None


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of ``pid``, or None if it is gone."""
    rest = _fields(pid)
    if rest is None or rest[0] == "Z":  # a zombie has already died
        return None
    return int(rest[1]), int(rest[19])


def identify(pid: int | None) -> ProcessIdentity | None:
    """Identify a live process by pid (None if the pid is invalid or not alive)."""
    if pid is None or pid <= 1:
        return None
    st = _stat(pid)
    return ProcessIdentity(pid, st[1]) if st else None


def is_descendant(pid: int) -> bool:
    """Whether ``pid``'s parent chain reaches this process (bounded walk)."""
    me = os.getpid()
    cur = pid
    for _ in range(64):
        st = _stat(cur)
        if st is None:
            return False
        parent = st[0]
        if parent == me:
            return True
        if parent <= 1:
            return False
        cur = parent
    return False


def alive(ident: ProcessIdentity) -> bool:
    """Whether the identified process still runs (same pid, same start time)."""
    st = _stat(ident.pid)
    return st is not None and st[1] == ident.start_ticks


def stopped(ident: ProcessIdentity) -> bool:
    """Whether the identified process is stopped by a signal (``/proc`` state ``T``): a
    rank that posts a pause's failure stops itself only just after, so it is continued
    only once this holds."""
    rest = _fields(ident.pid)
    return rest is not None and rest[0] == "T" and int(rest[19]) == ident.start_ticks


def send(ident: ProcessIdentity | None, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to an identified descendant.

    Returns:
        True if delivered; False if the process had already ended (nothing to do).

    Raises:
        SignalRefused: the target is unidentified, is this process, or is not a
            descendant of this process.
    """
    if ident is None or ident.pid <= 1:
        raise SignalRefused("no identified process to signal (pid unknown)")
    if ident.pid == os.getpid():
        raise SignalRefused("refusing to signal this process itself")
    # A pidfd pins the process: once it is open and the identity checks pass, the
    # signal reaches that very process even if it dies and its pid is reused meanwhile.
    try:
        fd = os.pidfd_open(ident.pid)
    except ProcessLookupError:
        return False
    try:
        if not alive(ident):
            return False
        if not is_descendant(ident.pid):
            raise SignalRefused(f"pid {ident.pid} is not a process this run started")
        try:
            signal.pidfd_send_signal(fd, sig)
        except ProcessLookupError:
            return False
        note_injected(ident.pid)
        return True
    finally:
        os.close(fd)


class Pinned:
    """A live descendant of this process, pinned by a pidfd (:func:`pin`).

    Signals sent through it reach that process or nobody: once it has ended (and been
    reaped), the kernel refuses the pidfd's signals instead of delivering them to a
    process that reused the pid. :meth:`close` releases the descriptor.
    """

    def __init__(self, ident: ProcessIdentity, fd: int) -> None:
        self.ident, self._fd = ident, fd
        self._lock = threading.Lock()  # close() and send() from different threads

    @property
    def pid(self) -> int:
        return self.ident.pid

    def alive(self) -> bool:
        """Whether the pinned process still runs (a zombie has ended)."""
        return self._fd >= 0 and alive(self.ident)

    def resume(self) -> bool:
        """Continue the pinned process if it is stopped (SIGCONT: a pause ends).

        Returns:
            False while it runs, not stopped yet (call again); True once continued, or
            if it has ended (nothing left to continue).
        """
        if not self.alive():
            return True
        if not stopped(self.ident):
            return False
        self.send(signal.SIGCONT)
        return True

    def send(self, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` to the pinned process.

        Returns:
            True if delivered; False if it has ended (or the handle was closed).
        """
        with self._lock:
            if self._fd < 0 or not alive(self.ident):
                return False
            try:
                signal.pidfd_send_signal(self._fd, sig)
            except ProcessLookupError:
                return False
        note_injected(self.ident.pid)
        return True

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __del__(self) -> None:  # a handle dropped unclosed must not leak its descriptor
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to do
            self.close()


def pin(pid: int | None) -> Pinned | None:
    """Pin a process this project just started.

    Returns:
        Its handle; None if it has ended already, or if ``pid`` is no descendant of
        this process any more (it ended and its pid went to another process): there is
        nothing of ours to signal then.

    Raises:
        SignalRefused: ``pid`` is unknown, invalid or this process.
    """
    if pid is None or pid <= 1:
        raise SignalRefused("no process to pin (pid unknown)")
    if pid == os.getpid():
        raise SignalRefused("refusing to pin this process itself")
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    # Checked after the pidfd is open: the descriptor then refers to the process checked.
    ident = identify(pid)
    if ident is None:
        os.close(fd)
        return None
    if not is_descendant(pid):
        os.close(fd)
        return None
    return Pinned(ident, fd)


def adopt(pid: int, fd: int) -> Pinned | None:
    """Pin ``pid`` by a pidfd another process of this project opened for it and handed
    over (the zygote, for a rank it forked: it opened the descriptor before it could
    reap the rank, so the descriptor is that rank's). Takes ownership of ``fd``.

    Returns:
        Its handle; None if it has ended already (the descriptor is closed then).
    """
    ident = identify(pid)
    try:
        if ident is None:
            raise ProcessLookupError(pid)
        # Signal 0 delivers nothing: it checks the descriptor's process was not reaped,
        # so ``pid`` was still its pid when identified just before.
        signal.pidfd_send_signal(fd, 0)
    except ProcessLookupError:
        os.close(fd)
        return None
    return Pinned(ident, fd)


def note_injected(pid: int) -> None:
    """Record that ``pid`` died (or is about to) of a failure this project injected."""
    with _noted:
        _injected[pid] = None
        _injected.move_to_end(pid)
        if len(_injected) > _KEEP:
            _injected.popitem(last=False)
        _noted.notify_all()


def injected(pid: int, within: float = 0.0) -> bool:
    """Whether ``pid`` was recorded by :func:`note_injected` (among the last few
    thousand), waiting up to ``within`` seconds for it to be."""
    with _noted:
        return _noted.wait_for(lambda: pid in _injected, timeout=within)


def strike_self(sig: int) -> None:
    """Deliver ``sig`` to this process itself: a rank that carries out its own failure
    order (gloo/faults.py), the one signal not sent to a descendant. Never to pid 0
    (the whole process group) or 1, whatever ``os.getpid()`` says in a container."""
    me = os.getpid()
    if me <= 1:
        raise SignalRefused(f"refusing to signal pid {me}")
    signal.pidfd_send_signal(os.pidfd_open(me), sig)
