"""Start the disk on a file's written bytes while the rest is still being written.

A plain ``write`` only fills the page cache; the disk starts when ``fsync`` asks, so a
large file is copied into memory first and written out after, one phase waiting for
the other. ``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)`` (Linux) starts
writeback of what is dirty without waiting for it, so called every few MiB it lets the
disk work while the writer copies the next chunk, and the final ``fsync`` has little
left to do (docs/measurements.md has the timings). It changes no durability
guarantee: ``fsync`` still decides that.

Python has no binding for it, so it is called through ``ctypes``; where the call does
not exist (not Linux) or fails, :func:`start` does nothing and the write is as before.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

#: Bytes written between two starts: small enough to keep the disk busy early, large
#: enough that the call (a few microseconds) costs nothing next to the copy.
CHUNK = 1 << 20
_WRITE = 2  # SYNC_FILE_RANGE_WRITE: start writeback of dirty pages, do not wait


def _bind() -> Callable[[int], object] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        # The process's own symbols (libc's among them): find_library("c") would run
        # ldconfig in a subprocess at every import of the checkpoint store.
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return lambda fd: fn(fd, 0, 0, _WRITE)


_SYNC_FILE_RANGE = _bind()


def start(fd: int) -> None:
    """Start writing ``fd``'s dirty pages to disk; return at once. A hint: failures
    (an fd that is not a regular file, a call the platform lacks) are ignored."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd)  # the return code is ignored: fsync reports real errors
