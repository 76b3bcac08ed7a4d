"""Progress on long work: a rich bar per run or per suite, silent with ``--quiet``."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainthrough.engines.callbacks import Callback
from trainthrough.engines.result import RunSummary
from trainthrough.events import Record

console = Console(stderr=True)


def make_progress(quiet: bool) -> Progress:
    """A rich progress display on stderr; off with ``--quiet`` or when not a terminal."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                    console=console, disable=quiet or not sys.stderr.isatty(),
                    transient=False)


class RunProgress(Callback):
    """Advances a bar by iterations and shows the last metric and failures."""

    def __init__(self, progress: Progress, description: str, total: int) -> None:
        self.p = progress
        self.task = progress.add_task(description, total=total, status="")
        self.failures = 0
        self.metric = ""

    def before_run(self, config: dict[str, Any]) -> None:
        self.p.update(self.task, total=config.get("max_iterations") or 1)

    def after_step(self, iteration: int, sim_seconds: float) -> None:
        if iteration % 10 == 0:
            self.p.update(self.task, completed=iteration)

    def after_eval(self, record: dict[str, Any]) -> None:
        self.metric = f"metric {record['metric']:.4g}"
        self._status()

    def on_event(self, event: Record) -> None:
        if event.get("type") == "failure":
            self.failures += 1
            self._status()

    def _status(self) -> None:
        extra = f"  failures {self.failures}" if self.failures else ""
        self.p.update(self.task, status=self.metric + extra)

    def after_run(self, summary: RunSummary) -> None:
        done = summary.result.iterations
        self.p.update(self.task, completed=done, total=done or 1)


class SaveWarnings(Callback):
    """Tells the user, on stderr and also with ``--quiet``, when a checkpoint was not
    written (the storage refused it: disk full, folder gone): the first time as it
    happens, and how many in all at the end (the run's count, ``checkpoints_failed``).
    The run trains on from the last save written, as on every engine
    (ft/checkpointer.py); each failed write is a ``checkpoint-failed`` event in
    events.jsonl."""

    def __init__(self) -> None:
        self.warned = False

    def on_event(self, event: Record) -> None:
        if event.get("type") != "checkpoint-failed" or self.warned:
            return
        self.warned = True
        at = f" at iteration {event['iteration']}" if "iteration" in event else ""
        console.print(f"trainthrough: warning: a checkpoint{at} was not written: "
                      f"{event.get('message')}; training goes on from the last one "
                      "written", markup=False, highlight=False, soft_wrap=True)

    def after_run(self, summary: RunSummary) -> None:
        failed = summary.result.checkpoints_failed
        if failed > 1:
            console.print(f"trainthrough: warning: {failed} checkpoint saves failed "
                          "in this run (events.jsonl: checkpoint-failed)", markup=False,
                          highlight=False, soft_wrap=True)
