"""Where one run's checkpoints live: ``<checkpoint dir>/run-<run id>/``.

Several runs may be pointed at one checkpoint folder (``--checkpoint-dir``, or a
config re-run as is). Each run therefore gets its own location inside it, named by
its run id, and a :class:`~trainthrough.ft.checkpoint.store.CheckpointStore` opened
on such a location stamps the id into every manifest it writes and refuses
(never loads, never prunes) a checkpoint stamped with another id. Listing, loading
and pruning thus only ever see the run's own checkpoints, whatever else shares the
folder. A resumed run keeps its id, which is how it finds its checkpoints again.

The location is one string because it must cross process boundaries unchanged (Ray
actors and gloo ranks open their own stores from it). A local one is therefore
absolute: those processes, and a run resumed from another folder, do not share the
working folder of the command that started the run.
"""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

from trainthrough.ft.checkpoint.manifest import RUN_RE

RUN_PREFIX = "run-"
_LOCATION_RE = re.compile(rf"^{RUN_PREFIX}({RUN_RE.pattern[1:-1]})$")


def new_run_id() -> str:
    """A fresh run id: UTC time (sortable) and 6 random hex digits, 22 characters.

    Fixed width, so manifests (whose bytes the sim engine charges) have the same size
    in every run of one configuration.
    """
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def absolute_base(base: str) -> str:
    """``base`` with a local path made absolute (against this process's working
    folder); a URL (``memory://``, ``s3://``, ``file://``...) as it is."""
    return base if "://" in base else str(Path(base).absolute())


def run_location(base: str, run_id: str) -> str:
    """The checkpoint location of run ``run_id`` under ``base`` (a path or fsspec URL).

    Raises:
        ValueError: ``run_id`` is not letters, digits, ``_`` and ``-`` (at most 64).
    """
    if not RUN_RE.fullmatch(run_id):
        raise ValueError(f"bad run id {run_id!r}: use letters, digits, '_' and '-' (<= 64)")
    return f"{base.rstrip('/')}/{RUN_PREFIX}{run_id}"


def run_of(url: str) -> str | None:
    """The run id a location belongs to (None: not a run's location)."""
    m = _LOCATION_RE.fullmatch(url.rstrip("/").rsplit("/", 1)[-1])
    return m.group(1) if m else None
