"""Data-parallel advice, by measurement: every data-parallel strategy run at the user's
failure rate and ranked by its measured time to target.

The parameter-server advisor predicts (model.py) from a few calibration runs. For data
parallel no such model holds yet: a failure there also costs a shrunk group until a
replacement joins, and relaxed sync (LocalSGD, DiLoCo) changes the optimization itself
(DiLoCo's outer momentum may reach a target in fewer steps with no failure at all),
which no rework bound captures. So each candidate, synchronous (rollback, lossy-forward,
checkpoint-restart) and relaxed (LocalSGD, DiLoCo, streaming DiLoCo), is run to the
target on the user's trace, and failure-free, for each seed, with the config's cost
model, and ranked by what it measured. The advice holds at that failure rate; a sweep
over rates is ``trainthrough compare --suite relaxed``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from trainthrough.config import RunConfig
from trainthrough.engines.result import RunResult
from trainthrough.errors import UserError
from trainthrough.faults.spec import FailureSpec, validate
from trainthrough.lab.advise.candidates import Candidate, candidates
from trainthrough.lab.validate import for_strategy, validate_run


@dataclass
class DpResult:
    """One candidate's runs, one entry per seed (None: not reached, or not reported)."""

    name: str
    family: str  # "synchronous" or "relaxed"
    seconds_to_target: list[float | None] = field(default_factory=list)
    free_seconds_to_target: list[float | None] = field(default_factory=list)
    #: committed samples a second over the same candidate's failure-free run, in %
    goodput: list[float | None] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)
    final_metric: list[float | None] = field(default_factory=list)

    @property
    def to_target(self) -> float | None:
        """Mean time to target over the seeds; None if a seed did not reach it."""
        return _mean(self.seconds_to_target, every=True)

    @property
    def to_target_se(self) -> float | None:
        """Its standard error over the seeds (None with one seed)."""
        xs = [x for x in self.seconds_to_target if x is not None]
        if len(xs) < 2 or len(xs) != len(self.seconds_to_target):
            return None
        return statistics.stdev(xs) / math.sqrt(len(xs))

    @property
    def free_to_target(self) -> float | None:
        return _mean(self.free_seconds_to_target, every=True)

    @property
    def mean_goodput(self) -> float | None:
        return _mean(self.goodput)

    @property
    def mean_failures(self) -> float:
        return statistics.fmean(self.failures) if self.failures else 0.0


def _mean(xs: list[float | None], every: bool = False) -> float | None:
    known = [x for x in xs if x is not None]
    if not known or (every and len(known) != len(xs)):
        return None
    return statistics.fmean(known)


@dataclass
class DpAdvice:
    """The candidates, best first (``results[0]``), and what they were run on."""

    workload: str
    engine: str
    clock: str
    mtbf: float
    trace: str
    ranks: int
    sync_every: int
    seeds: int
    metric: str
    results: list[DpResult]
    config: dict[str, Any]

    @property
    def recommended(self) -> DpResult:
        return self.results[0]

    @property
    def runner_up(self) -> DpResult | None:
        return self.results[1] if len(self.results) > 1 else None

    def best(self, family: str) -> DpResult | None:
        return next((r for r in self.results if r.family == family), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for r, out in zip(self.results, d["results"], strict=True):
            out.update(to_target=r.to_target, to_target_se=r.to_target_se,
                       free_to_target=r.free_to_target, mean_goodput=r.mean_goodput)
        d["recommended"] = self.recommended.name
        d["runner_up"] = self.runner_up.name if self.runner_up else None
        return d


def _rank_key(r: DpResult) -> tuple[bool, float, float]:
    """Reached the target on every seed first, by mean time; then by goodput."""
    t = r.to_target
    return (t is None, t if t is not None else 0.0, -(r.mean_goodput or 0.0))


def _committed_rate(s: RunResult) -> float | None:
    """Committed samples a second, where the engine reports them (sim does)."""
    secs, samples = s.sim_seconds, s.extras.get("samples_committed")
    return samples / secs if secs and samples is not None else None


def advise_dp(cfg: RunConfig, trace: FailureSpec, only: list[str] | None = None,
              say: Callable[[str], None] | None = None, seeds: int = 1,
              run: Callable[[RunConfig], RunResult] | None = None,
              named: Collection[str] = ()) -> DpAdvice:
    """Run every data-parallel candidate failure-free and on ``trace``, ``seeds`` times
    (seeds ``cfg.seed`` on), and rank them by measured time to target.

    ``cfg`` gives the workload, engine, ranks, ``sync_every`` (relaxed candidates) and
    cost model; its strategy and failures are ignored. ``run``: how a configuration is
    run (``runner.run_silent``, a scratch checkpoint folder each). ``named``: the fields
    the caller set by name (flags), refused where no candidate reads them, even at their
    default (:func:`~trainthrough.lab.validate.validate_run`); ``sync_every`` is read by
    the relaxed candidates only.

    Raises:
        UserError: an invalid configuration or trace, or no candidate.
    """
    from trainthrough.lab.advise.advisor import clock_name

    if run is None:
        from trainthrough.lab.runner import run_silent
        run = run_silent
    say = say or (lambda _: None)
    if trace.mtbf is None:
        raise UserError("advise needs a trace with an mtbf= trigger")
    if seeds < 1:
        raise UserError(f"--calibration-seeds must be at least 1 (got {seeds})")
    if not cfg.stop_at_target:
        raise UserError("advise ranks data-parallel strategies by time to the target: "
                        "stop_at_target must stay true")
    if cfg.ranks < 2:
        raise UserError(f"--ranks {cfg.ranks}: data-parallel advice weighs what the surviving "
                        "ranks do when one is lost, and one rank has no survivor: use "
                        "--ranks 2 or more")
    cands = candidates(cfg.engine, "dp", cfg.consistency, [trace], only)
    base = replace(cfg, failures=[], baseline=False)
    relaxed = [c for c in cands if c.strategy.relaxed]
    if not relaxed and ("sync_every" in named or cfg.sync_every != RunConfig.sync_every):
        raise UserError("--sync-every is read by the relaxed candidates (localsgd, diloco, "
                        "streaming-diloco) only, and none is weighed: drop it")
    for c in cands:  # every candidate's configuration, before any run
        validate_run(replace(_own(base, c), failures=[trace.text]),
                     set(named) - ({"sync_every"} if not c.strategy.relaxed else set()))
    validate([trace], {"rank": cfg.ranks})
    results, metric = [], ""
    for c in cands:
        r = DpResult(c.name, "relaxed" if c.strategy.relaxed else "synchronous")
        for seed in range(cfg.seed, cfg.seed + seeds):
            free = run(replace(_own(base, c), seed=seed))
            hit = run(replace(_own(base, c), seed=seed, failures=[trace.text]))
            r.free_seconds_to_target.append(_to_target(free))
            r.seconds_to_target.append(_to_target(hit))
            r.failures.append(hit.failures)
            r.final_metric.append(hit.final_metric)
            metric = hit.metric_name or metric
            a, b = _committed_rate(hit), _committed_rate(free)
            r.goodput.append(100.0 * a / b if a is not None and b else None)
            say(f"{c.name} seed {seed}: {_fmt(r.seconds_to_target[-1])} s to target with "
                f"{r.failures[-1]} failure(s), {_fmt(r.free_seconds_to_target[-1])} s "
                "failure-free")
        results.append(r)
    results.sort(key=_rank_key)
    return DpAdvice(cfg.workload, cfg.engine, clock_name(cfg.engine), trace.mtbf, trace.text,
                    cfg.ranks, cfg.sync_every, seeds, metric, results,
                    base.to_dict())


def _own(base: RunConfig, c: Candidate) -> RunConfig:
    """Candidate ``c``'s run of ``base``: the settings it reads (the relaxed sync interval
    only where it has outer steps, the checkpoint interval only where it saves)."""
    return for_strategy(base, c.name)


def _to_target(s: RunResult) -> float | None:
    """Seconds to the target on the engine's clock (``sim_seconds``: simulated on sim,
    wall on gloo and Ray); None if the run did not reach it."""
    v = s.sim_seconds_to_target
    return float(v) if s.converged and v is not None else None


def _fmt(v: float | None, spec: str = ".3g") -> str:
    return "n/a" if v is None else format(v, spec)
