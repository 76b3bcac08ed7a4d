"""What an engine claims it can run, and the check that refuses everything else.

Every engine declares a :class:`Capabilities` per paradigm: the consistency modes,
the values of each strategy mechanism, and the failure targets, triggers, phases and
modes it can deliver. Validation asks the chosen engine (:func:`refusal`) before a
run is built: anything not claimed is refused with one line that names the engines
that do claim it. Nothing is ever silently substituted, and ``ft/`` never names an
engine: which engine runs a strategy is a fact about engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainthrough.engines.options import ENGINE_SETTINGS
from trainthrough.faults.spec import FailureSpec
from trainthrough.ft.strategy import Strategy

MECHANISMS = ("sync", "checkpoint", "persist", "recovery", "replication", "outage")
# The injection points of each data-parallel step routine that exist in only one of
# them: dp/step.py's POINTS (every-step sync) and dp/relaxed.py's (LocalSGD, DiLoCo);
# kept here as names so that validation imports no torch (tests/test_relaxed.py checks).
SYNC_STEP_PHASES = frozenset({"forward", "backward", "allreduce", "update"})
RELAXED_STEP_PHASES = frozenset({"inner", "outer"})


@dataclass(frozen=True)
class Capabilities:
    """One engine's claims for one paradigm (every field a set of accepted values)."""

    consistency: frozenset[str]
    checkpoint: frozenset[str]
    persist: frozenset[str]
    recovery: frozenset[str]
    replication: frozenset[str]
    outage: frozenset[str]
    targets: frozenset[str]  # failure kinds: shard, worker, replica, rank
    triggers: frozenset[str]  # iter, time, mtbf
    phases: frozenset[str]  # "" (between steps) and named points; allreduce means allreduce:K
    modes: frozenset[str] = field(default_factory=lambda: frozenset({"crash"}))
    replica_position: bool = False  # failure specs may name a chain position (replica=)
    resume: bool = False  # starts a run from its newest checkpoint (``--resume``)
    # The consistency modes in which a failure due during another's recovery strikes
    # then and is recovered side by side with it (its own replacement, started at once),
    # not after it: it lengthens the outage by less than its recovery
    # (lab/advise/model.py outage).
    parallel_recovery: frozenset[str] = frozenset()
    # The consistency modes in which a failure due during a recovery is held back to its
    # end, and all held back then strike together and recover side by side (one
    # recovery more for all of them, lab/advise/model.py outage). A mode in neither set
    # recovers one failure after another.
    batched_recovery: frozenset[str] = frozenset()
    # The engine settings it reads (engines/options.py: ENGINE_SETTINGS); any other one
    # set away from its default is refused before the run.
    options: frozenset[str] = frozenset()
    # How often data-parallel replicas synchronize (ft/strategy.py SYNCS).
    sync: frozenset[str] = frozenset({"every-step"})


def caps(replica_position: bool = False, resume: bool = False,
         **kw: tuple[str, ...]) -> Capabilities:
    """Build :class:`Capabilities` from plain tuples (declaration sites stay short)."""
    sets = {k: frozenset(v) for k, v in kw.items()}
    unknown = sets.get("options", frozenset()) - set(ENGINE_SETTINGS)
    assert not unknown, f"not engine settings: {sorted(unknown)}"
    return Capabilities(replica_position=replica_position, resume=resume,  # type: ignore[arg-type]
                        **sets)


def _phase_key(phase: str | None) -> str:
    if phase is None:
        return ""
    return "allreduce" if phase.startswith("allreduce:") else phase


def _trigger(s: FailureSpec) -> str:
    return "iter" if s.at_iter is not None else "time" if s.at_time is not None else "mtbf"


def unmet(c: Capabilities, consistency: str, strategy: Strategy,
          specs: list[FailureSpec]) -> list[tuple[str, str]]:
    """Every (what, value) of a run that ``c`` does not claim, in a stable order."""
    out: list[tuple[str, str]] = []
    if consistency not in c.consistency:
        out.append(("consistency", consistency))
    for m in MECHANISMS:
        value = getattr(strategy, m)
        if value not in getattr(c, m):
            out.append((m, value))
    for s in specs:
        if s.kind not in c.targets:
            out.append(("failure target", s.kind))
        if _trigger(s) not in c.triggers:
            out.append(("failure trigger", _trigger(s)))
        key = _phase_key(s.phase)
        if key not in c.phases:
            out.append(("failure phase", s.phase or ""))
        elif key in (SYNC_STEP_PHASES if strategy.relaxed else RELAXED_STEP_PHASES):
            points = "inner, outer" if strategy.relaxed else "forward, backward, allreduce:K, update"
            out.append((f"failure phase (a {strategy.sync} step has {points})", s.phase or ""))
        if s.mode not in c.modes:
            out.append(("failure mode", s.mode))
        if s.replica is not None and (not c.replica_position
                                      or strategy.replication == "none"):
            out.append(("failure option", "replica= (a chain position)"))
    return out


@dataclass(frozen=True)
class Traits:
    """How an engine runs, for the layers above that must treat engines differently
    (asked through ``registry.traits``, never by the engine's name). The defaults describe an engine of real
    processes on the wall clock, outside Ray: an engine declares only what differs."""

    #: Deterministic, in this process, on a simulated clock: a rerun gives the same
    #: numbers (one calibration sample is exact), and its state may live in memory://.
    virtual_clock: bool = False
    #: Its ranks are processes of their own: they can run a user's own training loop,
    #: and they need real devices, collectives and on-disk checkpoints.
    hosts_processes: bool = True
    #: It runs on a Ray session, which ``--ray-address`` joins to a cluster (any host).
    on_ray: bool = False
