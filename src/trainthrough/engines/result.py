"""What every engine reports at the end of a run (the ``summary.json`` fields).

An engine fills a :class:`RunResult`; the lab's runner wraps it in a
:class:`RunSummary` with the run's identity and its :class:`Rework` (the
baseline-dependent fields, lab/rework.py). Both stay typed up to where they are
written: :meth:`RunSummary.to_dict` is ``summary.json``, one flat object.
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
        """The fields as JSON values, the engine's ``extras`` flattened among them."""
        d = asdict(self)
        extras = d.pop("extras")
        d.update(extras)
        return d


@dataclass(frozen=True)
class Rework:
    """How many more iterations a run took than its failure-free twin, and SCAR's bound
    on it (docs/bound.md). Every field is None without a baseline, and
    ``rework_iterations`` also when either run did not reach the target."""

    # In this order in results.csv's columns (a suite's table), as before they were typed.
    baseline_iterations_to_target: int | None = None
    contraction: float | None = None  #: the rate fitted on the baseline (lab/bound.py)
    rework_bound: float | None = None  #: None: no contraction fitted on the baseline
    rework_iterations: int | None = None


@dataclass(frozen=True)
class RunSummary:
    """A finished run as its folder records it: the engine's result, the run's identity
    (its checkpoints are under ``checkpoint_url``) and its rework."""

    result: RunResult
    run_id: str
    checkpoint_url: str
    rework: Rework = Rework()

    def to_dict(self) -> dict[str, Any]:
        """``summary.json``: the result's fields (extras flattened), the identity, the
        rework fields, in one object (the lab's fields win a name an engine's extras
        share)."""
        return {**self.result.to_dict(), "run_id": self.run_id,
                "checkpoint_url": self.checkpoint_url, **asdict(self.rework)}


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
