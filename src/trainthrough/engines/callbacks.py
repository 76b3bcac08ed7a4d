"""Lifecycle hooks engines call, so reports, progress bars and plots never edit a loop.

Call order for one run: ``before_run`` once; then, interleaved as they happen,
``after_step`` (every executed iteration), ``after_eval`` and ``on_params`` (every
evaluation) and
``on_event`` (failures, detections, checkpoints, recoveries); ``after_run`` once
with the summary. Every hook is a no-op by default: subclass and override.

``on_event`` receives the record as a plain dictionary, the JSON object written to
``events.jsonl`` (the engines build a :mod:`trainthrough.events` dataclass; the run
context stamps its ``to_record()``): this is the public API, and it stays a dict.
``trainthrough.events.parse`` turns one back into its dataclass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainthrough.events import Record

if TYPE_CHECKING:
    from trainthrough.engines.result import RunSummary


class Callback:
    """Base class for run hooks (all no-ops)."""

    def before_run(self, config: dict[str, Any]) -> None:
        """The run is about to start; ``config`` is the resolved configuration."""

    def after_step(self, iteration: int, sim_seconds: float) -> None:
        """An iteration was applied (``iteration`` counts executed iterations)."""

    def after_eval(self, record: dict[str, Any]) -> None:
        """An evaluation: iteration, sim_seconds, wall_seconds, metric, loss, extras."""

    def on_params(self, iteration: int, params: dict[str, Any]) -> None:
        """The parameters at an evaluation (live tensors: copy what you keep).

        Called where the engine holds them in this process (``sim``, the ``ray``
        parameter server); data parallel on real processes (gloo, Ray) evaluates on
        the first rank, where the parameters are, and sends only the scores, so this
        is not called there (so neither is the rework bound's fit, lab/bound.py)."""

    def on_event(self, event: Record) -> None:
        """A failure, detection, checkpoint, recovery or replica change: one
        ``events.jsonl`` record (docs/events.md), a fresh dict per call."""

    def after_run(self, summary: RunSummary) -> None:
        """The run ended with a folder (``lab.runner.run``); ``summary`` is what
        ``summary.json`` holds (``summary.to_dict()``: docs/architecture.md, "The run
        folder"), typed."""


class Callbacks(Callback):
    """Fan one call out to many callbacks."""

    def __init__(self, callbacks: list[Callback] | None = None) -> None:
        self.items = list(callbacks or [])

    def before_run(self, config: dict[str, Any]) -> None:
        for c in self.items:
            c.before_run(config)

    def after_step(self, iteration: int, sim_seconds: float) -> None:
        for c in self.items:
            c.after_step(iteration, sim_seconds)

    def after_eval(self, record: dict[str, Any]) -> None:
        for c in self.items:
            c.after_eval(record)

    def on_params(self, iteration: int, params: dict[str, Any]) -> None:
        for c in self.items:
            c.on_params(iteration, params)

    def on_event(self, event: Record) -> None:
        for c in self.items:
            c.on_event(event)

    def after_run(self, summary: RunSummary) -> None:
        for c in self.items:
            c.after_run(summary)
