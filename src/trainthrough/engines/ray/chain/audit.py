"""An audit of what a shard replica acknowledged, kept where it can be read after the fact.

With ``TRAINTHROUGH_CHAIN_AUDIT`` set to a folder in a replica's environment (a Ray
node's: actors get their node's), each replica appends JSON lines to a file of its
own there (``<replica name>-<pid>.jsonl``), flushed line by line so a SIGKILL keeps
what it wrote:

- ``{"ack": t, "gen": g, "pos": p, "worker": w, "seq": s}``: a worker's push answered
  as acknowledged (``t``: wall clock), by the replica leading generation ``g``, the
  push at chain position ``p`` (or, a duplicate, covered by it);
- ``{"state": t, "gen": g, "pos": p, "version": v, "applied": {w: s}}``: the replica's
  state whenever the driver reads its statistics (at the end of a run among others).

Nothing in the run reads it. It is the evidence a test, or an operator after an
incident, checks a chain with, apart from the driver's own accounting (which counts
what the workers say they were acknowledged): that no two replicas acknowledged as head
at once, that no generation handed out a position an earlier one had acknowledged, and
that every replica alive at the end holds every acknowledged push. The clocks of the
replicas' hosts must agree for the first check (one machine, or synchronized hosts);
the folder must be reachable from every node (a shared filesystem, or one machine).
Unset (the default): nothing is written.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, TextIO

#: The environment variable naming the folder.
ENV = "TRAINTHROUGH_CHAIN_AUDIT"


class Audit:
    """One replica's audit file (opened on the first line written)."""

    def __init__(self, name: str) -> None:
        folder = os.environ.get(ENV)
        self.path = (os.path.join(folder, f"{name}-{os.getpid()}.jsonl")
                     if folder else None)
        self._file: TextIO | None = None

    def _write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def acked(self, gen: int, pos: int, worker: int, seq: int) -> None:
        """A push was answered as acknowledged by this replica."""
        self._write({"ack": time.time(), "gen": gen, "pos": pos, "worker": worker,
                     "seq": seq})

    def state(self, gen: int, pos: int, version: int, applied: dict[int, int]) -> None:
        """This replica's state now."""
        self._write({"state": time.time(), "gen": gen, "pos": pos, "version": version,
                     "applied": {str(w): s for w, s in applied.items()}})
