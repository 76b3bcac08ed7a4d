"""Replacing a local file whole: a reader sees the old content or the new, never part.

The new content goes to ``<name>.tmp`` in the target's folder (same filesystem, so the
rename is atomic), which then replaces the target with :func:`os.replace`. If writing
fails, the temp file is removed and the target keeps its old content. A process killed
mid-write can leave ``<name>.tmp`` behind (never the target half-written): the name is
fixed, not random, so that whoever cleans a folder knows what to look for
(:data:`trainthrough.lab.recorder.TEMP_FILES`).

Atomic, not durable: nothing is fsynced, so after a power loss the target may hold the
old content. The files written this way (run status and summary, reports, results
tables, advice) can be made again by running again; the checkpoint store, whose files must
survive a power loss, does its own fsyncs (:mod:`trainthrough.ft.checkpoint.store`).

One writer per target at a time: two writers of one target share its temp name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def temp_path(path: Path) -> Path:
    """The temp file a write of ``path`` goes through."""
    return path.with_name(path.name + ".tmp")


@contextmanager
def atomic_open(path: Path, mode: str = "w", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """Open the temp file for writing; on a clean exit it replaces ``path``.

    Args:
        path: the target file (its folder must exist).
        mode: ``"w"`` or ``"wb"`` (with ``"t"``/``"b"`` as :func:`open` takes them).
        open_kwargs: passed to :func:`open` (``encoding``, ``newline``, ...).

    Raises:
        ValueError: ``mode`` does not write a new file.
        OSError: as :func:`open`, writing or :func:`os.replace` raise it; the temp file
            is gone and the target untouched.
    """
    if not mode.startswith("w") or "+" in mode:
        raise ValueError(f"atomic_open writes a new file: mode {mode!r} is not 'w' or 'wb'")
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, mode, **open_kwargs) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt too: no temp file left for a rerun to find
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes | str, encoding: str | None = None) -> None:
    """Replace ``path`` with ``data``: bytes as they are, text encoded with ``encoding``
    (None: the locale's, as :func:`open`)."""
    if isinstance(data, bytes):
        with atomic_open(path, "wb") as f:
            f.write(data)
    else:
        with atomic_open(path, "w", encoding=encoding) as f:
            f.write(data)
