"""What a resumed run may change, written once for ``trainthrough run --resume`` and
``launch(resume=True)``.

A resumed run continues the training recorded in its folder's ``config.toml``: the
same workload, strategy, sizes, seed, and the same checkpoint folder (its checkpoint
is read there: ``<checkpoint dir>/run-<id>/``, see lab/runner.py). Only what decides
how far and under what conditions this part of the run goes may differ
(:data:`FREE_ON_RESUME`):

- ``max_iterations``: the budget, not part of the training: the run goes on to the new
  one (one at the newest checkpoint's step ends it at once; one below it is refused,
  naming that step: lab/runner.py);
- ``wall_limit``: the limit of this invocation;
- ``failures``: the resumed part's own failures (iteration triggers at or before the
  checkpoint are skipped: :meth:`~trainthrough.engines.base.RunContext.resumed`);
- ``liveness_timeout``, ``max_restarts``: how this invocation supervises its ranks
  (when a silent rank is taken for dead, how often a repeating failure is retried).

Anything else that differs is refused in one line naming the first such setting
(:func:`conflict`); the resumed run records its config again in ``config.toml``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from trainthrough.config import RunConfig
from trainthrough.ft.checkpoint import absolute_base
from trainthrough.lab.runner import resolve_defaults

#: The settings a resumed run takes from the caller (module docstring says why).
FREE_ON_RESUME = ("max_iterations", "wall_limit", "failures", "liveness_timeout",
                  "max_restarts")


class Conflict(NamedTuple):
    """A setting a resume may not change, with the recorded and the asked value."""

    setting: str
    recorded: Any
    asked: Any


def _as_recorded(recorded: RunConfig, asked: RunConfig) -> RunConfig:
    """``asked`` as the run records a config: defaults resolved, the checkpoint folder
    absolute (None: the recorded one)."""
    ckpt = asked.checkpoint_dir
    asked = replace(asked, checkpoint_dir=recorded.checkpoint_dir if ckpt is None
                    else absolute_base(ckpt))
    return resolve_defaults(asked)[0]


def conflict(recorded: RunConfig, asked: RunConfig) -> Conflict | None:
    """The first setting outside :data:`FREE_ON_RESUME` in which ``asked`` differs
    from ``recorded`` (the run folder's ``config.toml``), or None. The caller refuses
    it in one line, naming the setting as its user typed it (a flag, an argument)."""
    mine, theirs = _as_recorded(recorded, asked).to_dict(), recorded.to_dict()
    for k in sorted(set(mine) | set(theirs)):
        if k not in FREE_ON_RESUME and mine.get(k) != theirs.get(k):
            return Conflict(k, theirs.get(k), mine.get(k))
    return None


def resumed_config(recorded: RunConfig, asked: RunConfig) -> RunConfig:
    """The configuration the resumed run runs: ``recorded`` with ``asked``'s
    :data:`FREE_ON_RESUME` settings (check :func:`conflict` first)."""
    mine = _as_recorded(recorded, asked)
    return replace(recorded, **{k: getattr(mine, k) for k in FREE_ON_RESUME})
