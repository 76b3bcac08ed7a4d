"""The advisor: calibrate on the chosen engine, predict every candidate, rank them.

:func:`advise` is what ``trainthrough advise`` runs; :func:`trace_spec` turns the
user's failure rate (``--mtbf 30s`` or a seeded MTBF spec) into the one failure spec
the prediction is for and a validation replays.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from trainthrough.config import RunConfig
from trainthrough.engines.registry import entry
from trainthrough.errors import UserError
from trainthrough.faults.spec import FailureSpec, parse, parse_one, validate
from trainthrough.lab.advise.calibrate import measure
from trainthrough.lab.advise.candidates import Candidate, candidates
from trainthrough.lab.advise.model import Baseline, Measured, Prediction, predict, rank
from trainthrough.lab.cloud_cost import Pricing, nodes

#: What fails, by default, when only an MTBF is given.
DEFAULT_KIND = {"ps": "shard", "dp": "rank"}  # dp: refused by advise() for now


def clock_name(engine: str) -> str:
    """The clock every advisor number is on (engines/sim/clock.py for ``sim``)."""
    return "simulated seconds" if engine == "sim" else "wall seconds"


def trace_spec(paradigm: str, mtbf: str | None, fail: str | None) -> FailureSpec:
    """The failure trace: ``--mtbf T`` (one random component of the paradigm's kind
    every T on average) or ``--fail SPEC`` with an ``mtbf=`` trigger in time units.

    Raises:
        UserError: neither or both given, a spec without a time MTBF, or one with
            ``max=`` (the model assumes failures keep coming).
    """
    if (mtbf is None) == (fail is None):
        raise UserError("advise needs a failure rate: --mtbf 30s, or --fail with an mtbf= "
                        "trigger (e.g. 'shards=50%@mtbf=30s'), not both")
    text = fail if fail is not None else f"{DEFAULT_KIND[paradigm]}=any@mtbf={mtbf}"
    specs = parse(text)
    if len(specs) != 1:
        raise UserError(f"--fail {text!r}: advise takes one failure spec (got {len(specs)})")
    s = parse_one(text)
    if s.mtbf is None or s.mtbf_unit != "s":
        raise UserError(f"--fail {text!r}: advise needs failures at a mean time between "
                        "them in seconds, e.g. 'shard=any@mtbf=30s' (not iter=, time= or "
                        "an mtbf in iterations)")
    if s.max_count is not None:
        raise UserError(f"--fail {text!r}: drop max=; the prediction assumes failures keep "
                        "coming at that rate until the target")
    return s


@dataclass
class Advice:
    """Everything the advisor found, ranked best first (``predictions[0]``)."""

    workload: str
    engine: str
    paradigm: str
    clock: str
    mtbf: float
    trace: str
    rank_by: str
    baseline: Baseline
    measured: list[Measured]
    predictions: list[Prediction]
    config: dict[str, Any]
    #: the engine recovers overlapping failures side by side (model.outage)
    parallel_recovery: bool = False

    @property
    def recommended(self) -> Prediction:
        return self.predictions[0]

    @property
    def runner_up(self) -> Prediction | None:
        return self.predictions[1] if len(self.predictions) > 1 else None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON: a number that is not finite (no progress, a bound for a
        run that did not contract) is null, as JSON has no infinity."""
        d = asdict(self)
        d["recommended"] = self.recommended.name
        d["runner_up"] = self.runner_up.name if self.runner_up else None
        out: dict[str, Any] = _finite(d)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Advice:
        """The advice :meth:`to_dict` gave (``advice.json``), plain data only: a null
        time to target or overhead is the infinity it stood for. Advice saved before
        ``parallel_recovery`` was recorded gets its engine's claim (a fact about the
        engine, not the run; its stored predictions stay as they were made)."""
        def pred(p: dict[str, Any]) -> Prediction:
            inf = {k: math.inf for k in ("seconds_to_target", "overhead") if p[k] is None}
            return Prediction(**{**p, **inf})
        fields = {k: v for k, v in d.items() if k not in ("recommended", "runner_up")}
        if "parallel_recovery" not in fields:  # asked only when the file lacks it
            fields["parallel_recovery"] = parallel_recovery(
                d["engine"], d["paradigm"], d["config"].get("consistency", "bsp"))
        return cls(**{**fields, "baseline": Baseline(**d["baseline"]),
                      "measured": [_measured(m) for m in d["measured"]],
                      "predictions": [pred(p) for p in d["predictions"]]})


def _measured(m: dict[str, Any]) -> Measured:
    """A stored :class:`Measured`; advice saved before every failure run's iteration
    was kept holds the first one alone (or null)."""
    at = m.get("failed_at")
    at = () if at is None else (at,) if isinstance(at, int) else tuple(at)
    return Measured(**{**m, "failed_at": at})


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def parallel_recovery(engine: str, paradigm: str, consistency: str) -> bool:
    """Whether ``engine`` recovers overlapping failures side by side (its claim)."""
    return consistency in entry(engine).capabilities[paradigm].parallel_recovery


def _nodes(cfg: RunConfig, c: Candidate) -> int:
    return nodes(c.strategy.replication, cfg.shards, cfg.replicas, cfg.workers)


def _measure_on(cfg: RunConfig, cands: list[Candidate], trace: FailureSpec,
                say: Callable[[str], None], seeds: int) -> tuple[Baseline, list[Measured]]:
    """:func:`measure`, sharing one Ray session (and its warm actors) between the runs
    on ``ray``, as suites do; shut down after if this call started it."""
    assert trace.mtbf is not None
    if cfg.engine != "ray":
        return measure(cfg, cands, trace, trace.mtbf, say, seeds)
    from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray

    started = ensure_ray(cfg.ray_address)
    try:
        return measure(cfg, cands, trace, trace.mtbf, say, seeds)
    finally:
        if started:
            shutdown_ray()


def advise(cfg: RunConfig, trace: FailureSpec, only: list[str] | None = None,
           rank_by: str = "time", say: Callable[[str], None] | None = None,
           pricing: Pricing | None = None, seeds: int = 1) -> Advice:
    """Calibrate, predict and rank (lab/advise/calibrate.py, model.py).

    ``cfg`` gives the workload, engine, sizes and cost model; its strategy and failures
    are ignored (every candidate is run, with the calibration's own failures).
    ``seeds``: calibration seeds from ``cfg.seed`` on, averaged (lab/advise/calibrate.py).

    Raises:
        UserError: an invalid configuration or trace, or no candidate.
    """
    say = say or (lambda _: None)
    if trace.mtbf is None:
        raise UserError("advise needs a trace with an mtbf= trigger")
    if seeds < 1:
        raise UserError(f"--calibration-seeds must be at least 1 (got {seeds})")
    if rank_by not in ("time", "cost"):
        raise UserError(f"--rank-by must be time or cost (got {rank_by!r})")
    if cfg.paradigm != "ps":
        # A data-parallel failure also costs a shrunk group until a replacement joins,
        # which neither the recovery record nor the rework shows; measured on sim (mlr,
        # 4 ranks, rollback, 8 seeds) this model was 28% under at an MTBF of 2 s, and
        # adding the shrunk time additively 82% over at 6 s (the group also counted
        # fewer failures than time / MTBF). Refused until that is modelled.
        raise UserError("advise predicts parameter-server runs (--paradigm ps) only; for "
                        "data parallel compare strategies with `trainthrough compare "
                        "--suite dataparallel`")
    cands = candidates(cfg.engine, cfg.paradigm, cfg.consistency, [trace], only)
    cfg = replace(cfg, strategy=cands[0].name, failures=[trace.text], baseline=False)
    cfg.validate()  # sizes, the engine's claims, the workload's options
    # The trace's ids against the sizes (runs check them only once built): before any run.
    validate([trace], {"shard": cfg.shards, "worker": cfg.workers, "replica": cfg.replicas})
    base, measured = _measure_on(cfg, cands, trace, say, seeds)
    by_name = {c.name: c for c in cands}
    parallel = parallel_recovery(cfg.engine, cfg.paradigm, cfg.consistency)
    preds = [predict(base, m, by_name[m.name].label, trace.mtbf, _nodes(cfg, by_name[m.name]),
                     pricing, parallel) for m in measured]
    return Advice(cfg.workload, cfg.engine, cfg.paradigm, clock_name(cfg.engine), trace.mtbf,
                  trace.text, rank_by, base, measured, rank(preds, rank_by),
                  replace(cfg, failures=[]).to_dict(), parallel)
