"""Making a checkpoint's written files durable: their fsyncs run together, on a few
long-lived threads.

Contract: :class:`Syncing` hands every path it is given to the pool (``_WORKERS``
fsyncs run at once, the rest wait their turn); :meth:`Syncing.wait` returns when all
of them are done and raises the first error one of them hit. Nothing is durable before ``wait`` returns: an fsync cut short by the
process exiting loses nothing that was promised.

Together, because the filesystem folds fsyncs that wait at the same time into one
journal commit: a checkpoint of several files costs about one disk sync, not one per
file. Long-lived threads, because starting a thread per fsync costs about as much as a
small save's own disk sync on a busy machine. The pool is made on first use and again
after a fork (a child does not inherit its threads). Figures in docs/measurements.md.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future

_WORKERS = 4  # files fsynced at once; more wait their turn (still durable, a bit later)


class _Pool:
    """Daemon threads taking fsyncs from one queue.

    Not a ``ThreadPoolExecutor``: its threads are not daemons and the interpreter joins
    them at exit, so a signal that ends the main thread while a worker is being started
    can leave the process hung at exit. These threads are daemons and started up front.
    An fsync cut short by the process exiting is harmless: nothing counts as durable
    before :meth:`Syncing.wait`.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue[tuple[str, Future[None]]] = queue.SimpleQueue()
        for i in range(_WORKERS):
            threading.Thread(target=self._work, daemon=True,
                             name=f"checkpoint-fsync-{i}").start()

    def _work(self) -> None:
        while True:
            path, future = self.jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                fsync_path(path)
            except BaseException as e:  # handed to the waiter, who raises it
                future.set_exception(e)
            else:
                future.set_result(None)

    def submit(self, path: str) -> Future[None]:
        future: Future[None] = Future()
        self.jobs.put((path, future))
        return future


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _executor() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():
            _pool = _Pool()
        return _pool


class Syncing:
    """fsyncs under way; :meth:`wait` returns once all are done."""

    def __init__(self, paths: list[str]) -> None:
        pool = _executor()
        self._futures: list[Future[None]] = [pool.submit(p) for p in paths]

    def wait(self) -> None:
        """Wait for every fsync (even after one failed: none is left running).

        Raises:
            OSError: the first failure; the files are then not known to be durable.
        """
        errors = [e for f in self._futures if (e := f.exception()) is not None]
        if errors:
            raise errors[0]


def fsync_path(path: str) -> None:
    """fsync a file or folder by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
