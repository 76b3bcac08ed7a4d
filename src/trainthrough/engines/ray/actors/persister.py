"""Checkpoint writes of one shard actor: inline (sync) or on one background thread (async).

Both modes run the same write; they differ only in where. The background thread is
long-lived (no thread start per save) and holds at most one write: a save that falls
due while the previous write is still running is *skipped*, not queued behind it (a
queue would grow without bound when writes are slower than the checkpoint interval,
and waiting would put the write back on the critical path). Skips are counted and
reported, so a run that could not keep up says so instead of claiming its saves.

Call order: :meth:`Persister.busy` (may this save start?), then :meth:`Persister.start`
(background) or :meth:`Persister.run` (inline, after :meth:`Persister.wait`);
:meth:`Persister.wait` before a restore; :meth:`Persister.take_error` to report a
background failure in the next result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from trainthrough.engines.ray.actors.reports import WriteStats
from trainthrough.errors import CheckpointWriteFailed

Write = Callable[[], Any]


def not_written(what: str, e: Exception) -> str:
    """A failed write, said once: the store names the checkpoint and the storage's
    reason itself (CheckpointWriteFailed); anything else gets ``what`` in front."""
    return str(e) if isinstance(e, CheckpointWriteFailed) else f"{what} was not written: {e}"


class Persister:
    """Runs checkpoint writes one at a time and accounts for them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._job: tuple[Write, str] | None = None  # the write handed to the thread
        self._running = False
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self.writes = self.skipped = 0
        self.seconds = 0.0  # spent in writes, inline or in the background

    def busy(self) -> bool:
        """Whether a background write is still running (a save due now is skipped)."""
        with self._cond:
            return self._running

    def skip(self) -> None:
        with self._cond:
            self.skipped += 1

    def run(self, write: Write) -> Any:
        """Write now, on the caller's thread (sync saves); exceptions propagate."""
        t0 = time.perf_counter()
        try:
            return write()
        finally:
            with self._cond:
                self.writes += 1
                self.seconds += time.perf_counter() - t0

    def start(self, write: Write, what: str) -> None:
        """Hand ``write`` to the background thread (caller checked :meth:`busy`).

        Its failure is kept, naming ``what``, for :meth:`take_error`.
        """
        with self._cond:
            if self._running:
                raise RuntimeError("a checkpoint write is already running")
            self._job, self._running = (write, what), True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="checkpoint-persist")
                self._thread.start()
            self._cond.notify_all()

    def wait(self) -> None:
        """Block until no write is running."""
        with self._cond:
            while self._running:
                self._cond.wait()

    def take_error(self) -> str | None:
        """The last background failure, once (None: every write since went through)."""
        with self._cond:
            error, self._error = self._error, None
            return error

    def stats(self) -> WriteStats:
        with self._cond:
            return WriteStats(writes=self.writes, skipped=self.skipped, seconds=self.seconds)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._job is None:
                    self._cond.wait()
                write, what = self._job
                self._job = None
            try:
                self.run(write)
            except Exception as e:  # reported by the next checkpoint or restore call
                with self._cond:
                    self._error = not_written(what, e)
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()
