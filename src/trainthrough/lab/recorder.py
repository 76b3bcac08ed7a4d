"""The run folder: ``config.toml``, ``metrics.jsonl``, ``events.jsonl``, ``summary.json``.

``summary.json`` is written last and atomically, so its presence means the run
finished; a folder without it is an interrupted run and tools treat it so.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, TextIO

from trainthrough.engines.callbacks import Callback


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write them as null rather than produce invalid JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


class RunRecorder(Callback):
    """Writes one run folder as the run goes."""

    def __init__(self, out: Path, config_toml: str) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(config_toml)
        self._metrics: TextIO = open(out / "metrics.jsonl", "w")  # noqa: SIM115
        self._events: TextIO = open(out / "events.jsonl", "w")  # noqa: SIM115

    def after_eval(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(_clean(record)) + "\n")

    def on_event(self, event: dict[str, Any]) -> None:
        self._events.write(json.dumps(_clean(event)) + "\n")
        self._events.flush()

    def close(self) -> None:
        self._metrics.close()
        self._events.close()

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Close the logs, then write ``summary.json`` atomically (last)."""
        self.close()
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(_clean(summary), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.out / "summary.json")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a ``.jsonl`` file written by a recorder."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
