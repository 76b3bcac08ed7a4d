"""Liveness of rank processes: a heartbeat each one sends, and the controller's watch.

Progress and liveness are kept apart. A step, an evaluation or a checkpoint may take
any time: the controller never counts the ranks' messages to decide that one is hung.
What a rank's peers can see, they report: a peer that stops inside a collective is
found by the collective timeout (:mod:`.timing`). What no peer sees (a process stopped
or frozen while nobody waits on it in a collective: a replacement before it joins, a
first member between steps, every rank at once), the controller sees here:

- :class:`Heartbeat`, in every rank process: a thread adds 1 to the store key
  ``beat/<slot>/<inc>`` every ``period`` seconds, on a store connection of its own,
  whatever the process's main thread is doing (torch's kernels and the store's calls
  let it run; a stopped or frozen process stops it);
- :class:`Watch`, in the controller: every ``period`` seconds it reads each live
  process's counter (one ``add(key, 0)``) and names those whose counter has not moved
  for ``timeout`` seconds of the controller's own clock (no clock is compared across
  hosts). A process that has never beaten is still starting: the controller bounds that
  with :data:`~.timing.START_SECONDS`, not here.

The controller fences a silent process out of the group (:mod:`.fencing`), ends it
(SIGKILL by its pin, or through Ray: peers blocked with it in a collective then fail at
once), and recovers its loss like any other death. A process fenced while it ran (a
paused or hung member its peers left) is ended by the same watch once it has been
silent this long.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

if TYPE_CHECKING:
    from trainthrough.engines.gloo.procs import Proc


def beat_key(slot: int, inc: int) -> str:
    """The store key incarnation ``inc`` of slot ``slot`` beats on."""
    return f"beat/{slot}/{inc}"


class Heartbeat:
    """The rank process's beat: a daemon thread, started at once, ended by :meth:`close`."""

    def __init__(self, host: str, port: int, slot: int, inc: int, period: float) -> None:
        self._host, self._port, self.key, self.period = host, port, beat_key(slot, inc), period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")
        self._thread.start()

    def _beat(self) -> None:
        try:
            # Its own connection: a store client is not shared between threads, and the
            # main thread's may be blocked in a long wait (a plan, a rendezvous).
            own = dist.TCPStore(self._host, self._port, is_master=False,
                                timeout=timedelta(seconds=max(10.0, 4 * self.period)))
            while True:
                own.add(self.key, 1)
                if self._stop.wait(self.period):
                    return
        except Exception:  # noqa: BLE001 - the controller and its store are gone: the
            return  # rank ends at its next store call; nobody is left to beat for

    def close(self) -> None:
        """Stop beating (the process is about to end). Joined: a thread still inside a
        store call when the interpreter exits would abort it."""
        self._stop.set()
        with contextlib.suppress(RuntimeError):
            self._thread.join(timeout=5)


class Watch:
    """The controller's view of the heartbeats: who has been silent for too long."""

    def __init__(self, store: dist.Store, timeout: float, period: float) -> None:
        self.store, self.timeout, self.period = store, timeout, period
        self._seen: dict[str, tuple[int, float]] = {}  # key -> (counter, when it moved)
        self._next = 0.0

    def silent(self, procs: Iterable[Proc], now: float | None = None) -> list[tuple[Proc, float]]:
        """The live processes among ``procs`` whose heartbeat stopped ``timeout`` seconds
        ago or more, each with when it was last seen moving. Looks every ``period``
        seconds (between looks: none)."""
        now = time.time() if now is None else now
        if now < self._next:
            return []
        self._next = now + self.period
        out = []
        for p in procs:
            if p.exitcode is not None:
                continue
            key = beat_key(p.slot, p.inc)
            count = int(self.store.add(key, 0))
            last = self._seen.get(key)
            if last is None or count != last[0]:
                self._seen[key] = (count, now)
            elif count > 0 and now - last[1] >= self.timeout:
                out.append((p, last[1]))
        return out
