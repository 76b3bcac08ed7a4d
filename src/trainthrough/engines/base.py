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
   strategy's policies, evaluates only through the context: ``ctx.observe`` after
   every iteration it finishes (the shared policy of :mod:`.evaluation` decides
   whether to evaluate, keep a copy or skip), ``ctx.disruption`` when a failure
   strikes or a recovery ends, and ``ctx.evaluate`` (the one target test, with its
   look-back) at the start and the end; it emits events (:mod:`trainthrough.events` records) through ``ctx.emit``, and
   returns ``ctx.result`` filled in. Everything it started is released before ``run``
   returns or raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainthrough.config import RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.evaluation import (
    EvalAction,
    EvalPolicy,
    Evaluations,
    Kept,
    params_bytes,
)
from trainthrough.engines.result import Limits, RunResult
from trainthrough.errors import UserError
from trainthrough.events import Event, Resumed
from trainthrough.faults.schedule import FailureSchedule
from trainthrough.faults.spec import FailureSpec, validate
from trainthrough.ft.checkpointer import Checkpointer
from trainthrough.ft.strategy import Strategy
from trainthrough.workloads.base import Evaluation, Params, Workload


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
    #: what was evaluated, seen and kept (engines/evaluation.py)
    evals: Evaluations = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.evals = Evaluations(EvalPolicy(self.limits.eval_every,
                                            keep_bytes=self.cfg.lookback_bytes))

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
        self.emit(Resumed(iteration=step, logical_iteration=step,
                          max_iterations=self.cfg.max_iterations), sim_seconds=sim_seconds)
        return step

    def start_clock(self) -> None:
        """Wall seconds count from now (real engines: when training starts, after
        processes are up), for events, evaluations and the result."""
        self._t0 = time.perf_counter()

    def wall(self) -> float:
        """Wall seconds since the context was built (real engines' clock)."""
        return time.perf_counter() - self._t0

    def emit(self, event: Event, sim_seconds: float | None = None) -> None:
        """Record an event (:mod:`trainthrough.events`): its record, stamped with the
        virtual clock (``sim``, whose event stream is bit-for-bit repeatable, so no wall
        time) or with wall seconds (real engines), goes to ``callback.on_event`` as a
        plain dictionary, the line ``events.jsonl`` gets."""
        record = event.to_record()
        if sim_seconds is None:
            wall = round(self.wall(), 4)
            record["wall_seconds"] = record["sim_seconds"] = wall
        else:
            record["sim_seconds"] = round(sim_seconds, 6)
        self.callback.on_event(record)

    # -- evaluation (engines/evaluation.py: when, and what is guaranteed) ---------------
    def observe(self, iteration: int, params: Callable[[], Params | None],
                sim_seconds: float | None = None, **extras: Any) -> bool:
        """Executed iteration ``iteration`` is done: evaluate it, keep a copy of its
        parameters for a look-back, or neither, as the evaluation policy decides.

        ``params`` is called only when they are needed (None: nothing to score now, e.g.
        a shard is down). Returns whether the run should stop (see :meth:`evaluate`).
        """
        action = self.evals.decide(iteration, self.result.iterations_to_target is not None)
        if action is EvalAction.SKIP or (p := params()) is None:
            return False
        if action is EvalAction.EVALUATE:
            return self.evaluate(p, iteration, sim_seconds, **extras)
        self.keep(iteration, p, sim_seconds, **extras)
        return False

    def keep(self, iteration: int, params: Params, sim_seconds: float | None = None,
             *, scored: Evaluation | None = None, **extras: Any) -> None:
        """Hold a copy of ``params`` (executed iteration ``iteration``) for a look-back,
        if it fits in ``lookback_bytes`` beside the copies held; or, ``scored``, the
        score of a copy the engine holds where it lives (``params`` empty)."""
        wall = self.wall()
        if not self.evals.policy.fits(sum(k.nbytes for k in self.evals.kept),
                                      params_bytes(params)):
            return  # not copied at all: the look-back scores what it has
        self.evals.keep(Kept(iteration, {n: v.detach().clone() for n, v in params.items()},
                             wall if sim_seconds is None else sim_seconds, wall, extras,
                             scored))

    def disruption(self, iteration: int, params: Callable[[], Params | None] | None = None,
                   sim_seconds: float | None = None, **extras: Any) -> None:
        """A failure struck, or a recovery ended, after executed iteration ``iteration``.

        The state at ``iteration`` is evaluated (the kept copy, else ``params()`` if
        given: the state just before the failure) unless it was already, and the policy
        evaluates the next few iterations, so curves show the dip.
        """
        self.evals.disrupted = iteration
        if iteration <= self.evals.scored:
            return
        k = self.evals.take(iteration)
        if k is not None:
            self.evaluate(k.params, iteration, k.sim_seconds, scored=k.scored,
                          _wall=k.wall_seconds, **k.extras)
        elif params is not None and (p := params()) is not None:
            self.evaluate(p, iteration, sim_seconds, **extras)

    def evaluated(self, iteration: int) -> bool:
        """Whether ``iteration`` (or a later one) was evaluated already: an engine's
        last iteration is evaluated unless it just was."""
        return self.evals.scored >= iteration

    def score(self, params: Params) -> Evaluation:
        """The workload's evaluation of ``params``, recording nothing."""
        return self.workload.evaluate(params)

    def look_back(self, iteration: int, ev: Evaluation) -> bool:
        """Whether the evaluation ``ev`` at ``iteration`` first scores the copies kept since
        the last evaluation (it reaches the target for the first time, or comes near it;
        engines/evaluation.py). Asked once per evaluation: :meth:`evaluate` asks itself
        unless told; an engine whose copies live elsewhere (gloo's first member) asks
        first, fetches them (:meth:`keep`), then passes the answer on."""
        return self.result.iterations_to_target is None and self.evals.wants_look_back(
            iteration, ev.metric, self._reaches(ev), self.limits.target)

    def evaluate(self, params: Params, iteration: int, sim_seconds: float | None = None,
                 *, scored: Evaluation | None = None, look_back: bool | None = None,
                 _wall: float | None = None, **extras: Any) -> bool:
        """Score ``params`` at executed iteration ``iteration``; the one target test.

        If the target is reached here for the first time (or nearly, see
        :meth:`look_back`), the copies kept since the last evaluation are scored first,
        oldest first, until one reaches it. Records every evaluation (``after_eval``, ``on_params``), updates
        the result (final metric; iterations and seconds to target the first time it is
        reached) and says whether the run should stop: the target was reached, the
        config stops there, and ``past_target`` more iterations (if any) are done.

        Args:
            scored: ``params``' evaluation, when the caller already has it.
            look_back: what :meth:`look_back` said, when the caller asked it already.
        """
        ev = scored if scored is not None else self.score(params)
        r = self.result
        if look_back is None:
            look_back = self.look_back(iteration, ev)
        if look_back:
            for k in self.evals.gap(iteration):
                self._record(k.params, k.iteration,
                             k.scored if k.scored is not None else self.score(k.params),
                             k.sim_seconds, k.wall_seconds, k.extras)
                if r.iterations_to_target is not None:
                    break
        wall = self.wall() if _wall is None else _wall
        self._record(params, iteration, ev, wall if sim_seconds is None else sim_seconds,
                     wall, extras)
        if not (r.converged and self.cfg.stop_at_target) or r.iterations_to_target is None:
            return False
        return iteration >= r.iterations_to_target * (1 + self.cfg.past_target)

    def _reaches(self, ev: Evaluation) -> bool:
        return self.workload.reached(ev.metric, self.limits.target)

    def _record(self, params: Params, iteration: int, ev: Evaluation, sim: float, wall: float,
                extras: dict[str, Any]) -> None:
        if params:  # an engine that scores where the parameters live passes none
            self.callback.on_params(iteration, params)
        self.callback.after_eval({"iteration": iteration, "sim_seconds": sim,
                                  "wall_seconds": wall, "metric": ev.metric, "loss": ev.loss,
                                  **extras, **ev.extras})
        r = self.result
        r.final_metric = ev.metric
        if r.iterations_to_target is None and self._reaches(ev):
            r.iterations_to_target, r.sim_seconds_to_target, r.converged = iteration, sim, True
            # 1: the iteration before was scored and had not reached it (exact).
            r.extras["target_resolution"] = (iteration - self.evals.scored
                                             if self.evals.scored >= 0 else 0)
        self.evals.scored_at(iteration)
        r.extras["evaluations"] = self.evals.count
