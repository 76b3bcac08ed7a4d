"""What every engine reports at the end of a run (the ``summary.json`` fields).

The lab adds the baseline-dependent fields (``baseline_iterations_to_target``,
``rework_iterations``, ``rework_bound``); everything else an engine fills in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from trainthrough.events import Recovery

if TYPE_CHECKING:
    from trainthrough.config import RunConfig
    from trainthrough.workloads.base import Workload


@dataclass
class RunResult:
    """Counters and outcome of one run."""

    workload: str
    strategy: str
    engine: str
    seed: int
    metric_name: str
    target: float | None  # None: the workload has none (a user's loop without one)
    direction: str
    converged: bool = False
    iterations: int = 0
    iterations_to_target: int | None = None
    sim_seconds_to_target: float | None = None
    failures: int = 0
    recoveries: list[Recovery] = field(default_factory=list)
    checkpoints: int = 0
    checkpoints_failed: int = 0  # saves a write of failed in (ft/checkpointer.py)
    checkpoint_bytes: int = 0
    checkpoint_blocked_seconds: float = 0.0
    updates_applied: int = 0
    updates_lost: int = 0
    shard_updates_lost: int = 0
    wall_seconds: float = 0.0
    sim_seconds: float = 0.0
    final_metric: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extras = d.pop("extras")
        d.update(extras)
        return d


@dataclass(frozen=True)
class Limits:
    """When a run stops and what it aims at: the config's values, else the workload's."""

    target: float
    max_iterations: int
    eval_every: int


def limits(cfg: RunConfig, workload: Workload) -> Limits:
    """Resolve a run's target and budgets (the runner already filled them into ``cfg``;
    engines built directly, as benchmarks do, get the workload's defaults)."""
    return Limits(cfg.target if cfg.target is not None else workload.default_target,
                  cfg.max_iterations or workload.default_max_iterations,
                  cfg.eval_every or workload.default_eval_every)


def new_result(cfg: RunConfig, workload: Workload, engine: str, target: float) -> RunResult:
    """An empty :class:`RunResult` for one run of ``workload`` on ``engine``."""
    return RunResult(workload=workload.name, strategy=cfg.strategy, engine=engine, seed=cfg.seed,
                     metric_name=workload.metric_name,
                     target=target if workload.has_target else None,
                     direction=workload.direction)
