"""A rank process's preemption notice: SIGTERM means "leave at a step boundary", not death.

A spot machine's rank gets SIGTERM some seconds before its SIGKILL (the notice). A rank
that died of it would lose the step in flight and make its group roll back; a rank that
finishes the step, commits it with its group and leaves loses nothing. So in a rank
process of the ``gloo`` engine SIGTERM ends nothing by itself: :class:`RankNotice` tells
the controller (a :class:`~.messages.Noticed` message), which asks the group to stop after
a step (the ``ctl`` request every member agrees on in its commit vote, protocol.py) and
publishes the next attempt without this rank; the rank then finds itself left out of
the plan and ends cleanly (session.py). An injected ``mode=preempt:<notice>`` failure
(faults.py) delivers the very same SIGTERM to the rank itself, so both take one path.

Why a thread: Python runs a signal's handler in the main thread between two bytecodes,
which may be seconds away (a long compute, a wait for a plan); the C-level handler
writes the signal's number to the wakeup descriptor at once, and the thread reading it
posts the notice on a store connection of its own. Interrupted system calls restart
(``siginterrupt`` off): the notice must not break a collective or a store call in flight.

Installed only in a process's main thread and only where the engine says its ranks take
notices (:attr:`~.protocol.RunSpec.notice`): a rank on a Ray node leaves SIGTERM to
Ray.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import ClassVar

import torch.distributed as dist

from trainthrough.engines.gloo.messages import Noticed
from trainthrough.engines.gloo.protocol import post
from trainthrough.engines.signals import strike_self


class RankNotice:
    """This process's SIGTERM watch; :attr:`current` once installed."""

    #: The watch of this process (the injector delivers a preemption through it).
    current: ClassVar[RankNotice | None] = None

    def __init__(self, host: str, port: int, slot: int, inc: int,
                 logical: Callable[[], int] | None = None) -> None:
        self._host, self._port, self.slot, self.inc = host, port, slot, inc
        #: reads the rank's committed steps, for the notice (set once the trainer exists)
        self.logical = logical
        self.given = threading.Event()  # a SIGTERM came (the notice was posted)
        self._injected: tuple[str, float] | None = None  # (spec, notice seconds)
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._old = signal.signal(signal.SIGTERM, lambda *_: None)  # the thread acts
        signal.siginterrupt(signal.SIGTERM, False)
        self._old_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, daemon=True, name="notice")
        self._thread.start()
        RankNotice.current = self

    @classmethod
    def install(cls, host: str, port: int, slot: int, inc: int) -> RankNotice | None:
        """The watch, or None where signals cannot be handled here (not the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return None
        return cls(host, port, slot, inc)

    def preempt(self, spec: str, notice: float) -> None:
        """An injected preemption (faults.py): the notice of ``spec``, which the controller
        follows with SIGKILL ``notice`` seconds later if this rank has not left."""
        self._injected = (spec, notice)
        strike_self(signal.SIGTERM)

    def _watch(self) -> None:
        store: dist.TCPStore | None = None
        with contextlib.suppress(Exception):  # connected ahead: a notice goes out at once
            store = dist.TCPStore(self._host, self._port, is_master=False,
                                  timeout=timedelta(seconds=10))
        while True:
            try:
                data = os.read(self._r, 64)
            except OSError:
                return
            if not data:
                return  # closed
            if signal.SIGTERM not in data or self.given.is_set():
                continue  # another signal's byte, or a notice already given
            self.given.set()
            logical = self.logical() if self.logical else -1  # as the notice came
            spec, seconds = self._injected or (None, None)
            with contextlib.suppress(Exception):  # the controller is gone: nobody to tell
                if store is None:
                    store = dist.TCPStore(self._host, self._port, is_master=False,
                                          timeout=timedelta(seconds=10))
                post(store, Noticed(slot=self.slot, inc=self.inc, pid=os.getpid(),
                                    logical=logical, spec=spec, notice_seconds=seconds))

    def close(self) -> None:
        """Stop watching (the process ends): SIGTERM is left as it was found."""
        with contextlib.suppress(ValueError):  # not the main thread: nothing was installed
            signal.set_wakeup_fd(self._old_fd)
            signal.signal(signal.SIGTERM, self._old)
        os.close(self._w)  # the thread reads the end of the pipe and returns
        self._thread.join(timeout=5)
        os.close(self._r)
        if RankNotice.current is self:
            RankNotice.current = None
