"""Making a checkpoint's written files durable: their fsyncs run together, on a few
long-lived threads.

Together: the filesystem folds fsyncs that wait at the same time into one journal
commit, so a checkpoint of several files costs about one disk sync instead of one per
file (which made small checkpoints ~5x slower than a plain write of the same bytes).

Long-lived: a thread started per fsync cost 0.1 ms when the machine was quiet and ~0.7
ms when busy (the new thread must win the GIL to report that it started), three per
save of the cnn shard: about as long as the save's own disk sync. The pool is made on
first use and again after a fork (a child does not inherit its threads).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

_WORKERS = 4  # files fsynced at once; more wait their turn (still durable, a bit later)
_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(_WORKERS, "checkpoint-fsync"))
        return _pool[1]


class Syncing:
    """fsyncs under way; :meth:`wait` returns once all are done."""

    def __init__(self, paths: list[str]) -> None:
        pool = _executor()
        self._futures: list[Future[None]] = [pool.submit(fsync_path, p) for p in paths]

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
