"""The run folder as a run writes it: ``status.json``, ``config.toml``, ``metrics.jsonl``,
``events.jsonl``, ``summary.json``.

``status.json`` is written first (``running``) and again when the run ends
(``complete``, ``failed`` or ``interrupted``, with the reason), each time atomically
(temp file, then rename), so a reader never sees half of it. ``summary.json`` is written
only for a run that finished, last and atomically, and before the status says
``complete``: its presence is what makes a folder a complete run, whatever the status
says (a run killed between the two renames is still complete). A run killed with
SIGKILL cannot update its status: it stays ``running``, with the pid of a process that
is gone (:mod:`trainthrough.lab.run_folder` reads it so).

A resumed run (``--resume``) appends to the logs it finds; the engine's ``resumed``
event marks where the second part begins.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Any, TextIO

from trainthrough._atomic import atomic_write, temp_path
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.result import RunSummary
from trainthrough.engines.signals import identify
from trainthrough.events import Record

STATUS = "status.json"
SUMMARY = "summary.json"
CONFIG = "config.toml"
#: Every name a run writes in its folder (``--overwrite`` removes these and no other).
RUN_FILES = (CONFIG, "metrics.jsonl", "events.jsonl", SUMMARY, STATUS)
#: The temp names the atomic writes go through (left behind by a kill mid-write).
TEMP_FILES = tuple(temp_path(Path(name)).name for name in (SUMMARY, STATUS, CONFIG))


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write them as null rather than produce invalid JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


def write_status(out: Path, state: str, run_id: str, reason: str | None = None) -> None:
    """Write ``out/status.json`` atomically.

    Args:
        state: ``running``, ``complete``, ``failed`` or ``interrupted``.
        run_id: the run's id (its checkpoints live under ``<checkpoint dir>/run-<id>/``).
        reason: why a run failed or was interrupted (one line).
    """
    doc = {"state": state, "reason": reason, "run_id": run_id,
           "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "pid": os.getpid(), "pid_start": _start_ticks(), "host": socket.gethostname()}
    atomic_write(out / STATUS, json.dumps(doc, indent=2) + "\n")


def _start_ticks() -> int | None:
    """This process's kernel start time: with the pid, who wrote the status (a pid alone
    may have been reused by the time a reader looks)."""
    me = identify(os.getpid())
    return me.start_ticks if me is not None else None


def _open_log(path: Path, append: bool) -> TextIO:
    """A log opened for writing; appending after a line torn by a kill starts a new line,
    so the torn one stays a single unreadable line that tolerant readers skip."""
    if append and path.is_file() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
        log = open(path, "a")  # noqa: SIM115
        if torn:
            log.write("\n")
        return log
    return open(path, "a" if append else "w")  # noqa: SIM115


class RunRecorder(Callback):
    """Writes one run folder as the run goes.

    Call order: construct (status ``running``, then the config and empty logs), the
    hooks as the run goes, then either :meth:`write_summary` (the run finished) or
    :meth:`mark` (it failed or was interrupted), then :meth:`close`.
    """

    def __init__(self, out: Path, config_toml: str, run_id: str, append: bool = False) -> None:
        """Args:
            out: the run folder (created if missing).
            config_toml: the resolved configuration; a resumed run (``append``) keeps
                the recorded one, replaced only when the resume changed it (a new
                iteration budget: ``trainthrough run --resume --max-iterations``).
            run_id: the run's id, recorded in ``status.json``.
            append: continue the logs of an earlier, incomplete run of this folder.
        """
        self.out, self.run_id = out, run_id
        self.finished = False  # summary.json is written: the run is complete
        out.mkdir(parents=True, exist_ok=True)
        write_status(out, "running", run_id)  # first: nothing here looks finished
        config = out / CONFIG
        if not append:
            config.write_text(config_toml)
        elif config.read_text() != config_toml:
            atomic_write(config, config_toml)  # whole, old or new: never half of each
        self._metrics = _open_log(out / "metrics.jsonl", append)
        self._events = _open_log(out / "events.jsonl", append)

    def after_eval(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(_clean(record)) + "\n")
        self._metrics.flush()  # a run killed later keeps its curve up to here

    def on_event(self, event: Record) -> None:
        self._events.write(json.dumps(_clean(event)) + "\n")
        self._events.flush()

    def close(self) -> None:
        self._metrics.close()
        self._events.close()

    def write_summary(self, summary: RunSummary) -> None:
        """Close the logs, write ``summary.json`` atomically (last of the run's files),
        then mark the status ``complete``."""
        self.close()
        atomic_write(self.out / SUMMARY,
                     json.dumps(_clean(summary.to_dict()), indent=2, sort_keys=True) + "\n")
        self.finished = True
        write_status(self.out, "complete", self.run_id)

    def mark(self, state: str, reason: str) -> None:
        """The run ended without a summary: close the logs, record ``state`` and why."""
        self.close()
        write_status(self.out, state, self.run_id, reason)


def complete(folder: Path) -> bool:
    """Whether ``folder`` holds a finished run; readers leave the others out, or say so."""
    return (folder / SUMMARY).is_file()


def read_jsonl_tolerant(path: Path) -> list[dict[str, Any]] | None:
    """Records of a ``.jsonl`` file, skipping a torn last line; None if it is missing."""
    if not path.is_file():
        return None
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out
