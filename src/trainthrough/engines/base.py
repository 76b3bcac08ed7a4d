"""The engine contract: the run context an engine receives and the calls it makes.

An engine is a *host*: it decides where shards, workers and ranks live and how a
failure is delivered (a flag in ``sim``, SIGKILL in ``ray`` and ``gloo``). It never
re-resolves a strategy, re-parses a failure spec or writes its own evaluation: the
runner builds one :class:`RunContext` and everything downstream reads it.

Call order for one run (as torch DCP's ``StorageWriter`` numbers its calls):

1. Validation reads the engine's declared ``CAPABILITIES``
   (:mod:`trainthrough.engines.registry`) and refuses anything it does not claim,
   before anything is built.
2. The runner builds the :class:`RunContext` once: resolved config, workload,
   strategy, parsed failure specs, limits, callback, checkpoint location, the
   evaluator and the empty result.
3. ``factory(ctx)`` builds the engine (the ``ENGINE`` entry of its package). It may
   raise :class:`~trainthrough.errors.UserError` for sizes it cannot host; it starts
   no process yet.
4. ``engine.run()`` starts what it needs, calls ``ctx.callback.before_run`` once;
   if ``ctx.resume`` (``--resume``), it then loads the newest valid checkpoint of
   ``ctx.checkpoint_url`` through its own restore path (the one recovery uses) instead
   of starting from ``x0``, and calls :meth:`RunContext.resumed` once with its step
   (an engine that cannot resume does not claim ``resume`` in its capabilities and is
   refused at 1); it then trains, delivers the failures of ``ctx.schedule(sizes)``, recovers through the
   strategy's policies, evaluates only through ``ctx.evaluate`` (which also applies
   the target test), emits events through ``ctx.emit``, and returns ``ctx.result``
   filled in. Everything it started is released before ``run`` returns or raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainthrough.config import RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.result import Limits, RunResult
from trainthrough.errors import UserError
from trainthrough.faults.schedule import FailureSchedule
from trainthrough.faults.spec import FailureSpec, validate
from trainthrough.ft.checkpointer import Checkpointer
from trainthrough.ft.strategy import Strategy
from trainthrough.workloads.base import Params, Workload


class Engine(Protocol):
    """What the runner calls on an engine (see the module docstring for the order)."""

    def run(self) -> RunResult: ...


@dataclass
class RunContext:
    """Everything one run needs, resolved once by the runner."""

    cfg: RunConfig  # fully resolved (defaults filled from the workload)
    workload: Workload
    strategy: Strategy
    specs: list[FailureSpec]
    limits: Limits
    callback: Callback
    checkpoint_url: str
    result: RunResult
    engine: str
    #: start from the newest valid checkpoint in ``checkpoint_url``, not from ``x0``
    #: (the run's earlier, interrupted part wrote it; see :meth:`resumed`)
    resume: bool = False
    clock: Callable[[], float] = field(default=time.perf_counter)
    _t0: float = field(default_factory=time.perf_counter)

    def schedule(self, sizes: dict[str, int]) -> FailureSchedule:
        """The run's seeded failure schedule over an engine's component counts.

        Raises:
            UserError: a spec names a component the run does not have.
        """
        validate(self.specs, sizes)
        return FailureSchedule(self.specs, sizes, self.cfg.seed)

    def resumed(self, step: int | None, schedule: FailureSchedule, checkpointer: Checkpointer,
                sim_seconds: float | None = None) -> int:
        """The engine restored checkpoint ``step`` to resume the run (``self.resume``).

        The run goes on from logical (and executed) iteration ``step``: failures whose
        iteration trigger is at or before it were delivered in the earlier part and do
        not fire again (time triggers count from the resumption, as the clock does);
        the checkpoint policy is not asked again about iterations up to ``step``. A
        ``resumed`` event marks the point in ``events.jsonl``; the summary records it
        (``resumed_from``).

        Returns:
            ``step``.

        Raises:
            UserError: ``step`` is None: no checkpoint of the run could be loaded.
        """
        if step is None:
            raise UserError(f"--resume: no valid checkpoint in {self.checkpoint_url} "
                            "(each was missing or corrupt); add --overwrite to run it again")
        schedule.skip_through(step)
        checkpointer.resume_at(step)
        self.result.extras["resumed_from"] = step
        self.emit({"type": "resumed", "iteration": step, "logical_iteration": step},
                  sim_seconds=sim_seconds)
        return step

    def start_clock(self) -> None:
        """Wall seconds count from now (real engines: when training starts, after
        processes are up), for events, evaluations and the result."""
        self._t0 = time.perf_counter()

    def wall(self) -> float:
        """Wall seconds since the context was built (real engines' clock)."""
        return time.perf_counter() - self._t0

    def emit(self, event: dict[str, Any], sim_seconds: float | None = None) -> None:
        """Record an event: stamped with the virtual clock (``sim``, whose event stream
        is bit-for-bit repeatable, so no wall time) or with wall seconds (real engines)."""
        if sim_seconds is None:
            wall = round(self.wall(), 4)
            event.setdefault("wall_seconds", wall)
            event.setdefault("sim_seconds", wall)
        else:
            event.setdefault("sim_seconds", round(sim_seconds, 6))
        self.callback.on_event(event)

    def evaluate(self, params: Params, iteration: int, sim_seconds: float | None = None,
                 **extras: Any) -> bool:
        """Score ``params`` at executed iteration ``iteration``; the one target test.

        Records the evaluation (``after_eval``, ``on_params``), updates the result
        (final metric; iterations and seconds to target the first time it is reached)
        and says whether the run should stop: the target was reached, the config
        stops there, and ``past_target`` more iterations (if any) are done.
        """
        wall = self.wall()
        sim = wall if sim_seconds is None else sim_seconds
        self.callback.on_params(iteration, params)
        ev = self.workload.evaluate(params)
        self.callback.after_eval({"iteration": iteration, "sim_seconds": sim,
                                  "wall_seconds": wall, "metric": ev.metric, "loss": ev.loss,
                                  **extras, **ev.extras})
        r = self.result
        r.final_metric = ev.metric
        if r.iterations_to_target is None and self.workload.reached(ev.metric, self.limits.target):
            r.iterations_to_target, r.sim_seconds_to_target, r.converged = iteration, sim, True
        if not (r.converged and self.cfg.stop_at_target) or r.iterations_to_target is None:
            return False
        return iteration >= r.iterations_to_target * (1 + self.cfg.past_target)
