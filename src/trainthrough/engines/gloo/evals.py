"""The evaluation policy on gloo: the first member scores in place, the controller records.

The parameters live in the ranks, and there they stay: the group's first member
evaluates its own replica and posts the scores (:class:`~.messages.Metrics`), never the
tensors, so nothing the size of the model goes through the store (protocol.py). The
policy and what it guarantees are :mod:`trainthrough.engines.evaluation`'s, shared with
every engine. After every committed step the first member (:class:`RankEvals`) asks
the shared :class:`~trainthrough.engines.evaluation.EvalPolicy` whether to evaluate
(``EVALUATE``), keep a copy in its own memory (``KEEP``, within ``lookback_bytes``) or
neither. When an evaluation asks for a look-back, the controller
(:class:`ControllerEvals`) asks the first member for the scores of its copies through
the store and holds that evaluation, and every later one, back until they are in.
Call order (store key ``evalctl``, JSON, written by the controller):

1. the controller sets ``evalctl`` before any rank starts: ``acked`` (the last
   iteration evaluated: copies up to it are dropped), ``reached`` (the target is
   known: nothing more is kept) and ``ask`` (``[id, after, before]``: score your
   copies of the iterations strictly between, or null);
2. the first member reads it at its regular evaluations, after a recovery and, while
   an ask stands, at every commit (one store round trip each); it answers an ask it
   has not answered with ``copies`` events: the scores of its copies in the range,
   oldest first, up to the first that reaches the target (the controller's look-back
   stops there too), possibly none; then evaluates or keeps its step as the policy
   says;
3. when the first member leaves the run (the end, or a checkpoint-restart), it scores
   and sends, unasked (``id`` 0), what a look-back may still ask for once it is gone:
   every copy before the last evaluation it posted (which the controller may not have
   recorded yet), and, when the evaluation it posts last reaches the target, the copies
   before that one. On a restart the newest copy is evaluated as it leaves (the state
   the failure struck). After a re-formation the first commit evaluates the copy of
   the last commit before the failure, likewise.

An evaluation is part of the first member's step: its peers wait for it at their next
allreduce, as for a slow step, so it must end within the collective timeout
(``cost.timeout_seconds``) like any step. The controller once scored beside the ranks,
on a core they need, and received every evaluated replica through the store.

Copies live in the first member only: a first member that dies takes them along,
and that look-back scores what the controller has (``target_resolution`` says how
exact the result is). A copy is scored by the workload's own ``evaluate``, the
function the controller used to call, so the scores are the same (up to the
summation order of a multi-threaded evaluation: a rank evaluates on one thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from trainthrough.engines.evaluation import EvalAction, EvalPolicy, params_bytes
from trainthrough.engines.gloo.messages import Copies, Metrics
from trainthrough.engines.gloo.protocol import get, post, put
from trainthrough.workloads.base import Evaluation

if TYPE_CHECKING:
    from trainthrough.engines.gloo.port import ControllerPort

KEY = "evalctl"
#: Scores per ``copies`` event: each is ~100 bytes of JSON, far under the store's cap.
CHUNK = 1000
Tensors = dict[str, torch.Tensor]


class Scorer(Protocol):
    """What scores a copy on the rank: the run's workload (its ``evaluate`` and the
    direction of its metric)."""

    def evaluate(self, params: Tensors) -> Evaluation: ...

    def reached(self, metric: float, target: float) -> bool: ...


@dataclass
class _Copy:
    logical: int
    applied: int
    params: Tensors


class RankEvals:
    """The first member's side: which commits are evaluated, which kept, and look-backs.

    ``scorer``: what scores a kept copy (the workload); None where only the live model
    can be evaluated (a user's loop: its ``evaluate`` reads its own model), which then
    keeps no copies.
    """

    def __init__(self, policy: EvalPolicy, store: dist.Store, scorer: Scorer | None,
                 target: float) -> None:
        self.policy, self.store, self.scorer, self.target = policy, store, scorer, target
        self.kept: dict[int, _Copy] = {}  # executed -> its copy
        self.last: int | None = None  # the executed count of this process's last commit
        self.disrupted: int | None = None
        self.answered = 0  # the last ask answered
        self.posted = -1  # the last iteration this process posted an evaluation of
        self.ctl: dict[str, Any] = {"acked": -1, "reached": False, "ask": None}

    def after_commit(self, executed: int, logical: int, applied: int, params: Tensors,
                     recovered: bool, keep: bool = True) -> bool:
        """A step was committed: returns whether to evaluate the replica now.

        ``recovered``: this is the first commit after a recovery (the copy of the last
        commit before the failure, if kept, is evaluated first: the dip starts there).
        ``keep``: copies are useful (False when the parameters evaluated do not change).
        """
        previous = executed - 1 if self.last is None else self.last
        self.last = executed
        p = self.policy
        if recovered or self.ctl["ask"] is not None or executed // p.every > previous // p.every:
            self._refresh()  # at regular evaluations, after recoveries, while asked
        if recovered:
            self.disrupted = previous
            if previous in self.kept:
                self._post_copy(previous)
        action = p.decide(executed, previous, bool(self.ctl["reached"]), self.disrupted)
        if action is EvalAction.KEEP and keep and self.scorer is not None:
            held = sum(params_bytes(c.params) for c in self.kept.values())
            if p.fits(held, params_bytes(params)):  # the oldest of the interval are kept
                self.kept[executed] = _Copy(logical, applied,
                                            {n: v.detach().clone() for n, v in params.items()})
        return action is EvalAction.EVALUATE

    def post(self, executed: int, logical: int, applied: int, ev: Evaluation,
             final: bool = False) -> None:
        """Post the evaluation of the replica after ``executed`` (the scores only)."""
        post(self.store, Metrics(iteration=executed, logical=logical, final=final,
                                 applied=applied, metric=ev.metric, loss=ev.loss,
                                 extras=dict(ev.extras)))
        self.posted = max(self.posted, executed)

    def leave(self, last: tuple[int, Evaluation] | None = None) -> None:
        """This process leaves the run: answer a pending ask, and send the scores of the
        copies a look-back may still ask for (module docstring, 3); drop every copy.

        ``last``: ``(iteration, evaluation)`` this process posts next and last (the end of
        the run), if any.
        """
        self._refresh()
        before = [i for i in sorted(self.kept) if i < self.posted]
        if last is not None and self._reaches(last[1]):
            before = [i for i in sorted(self.kept) if i < last[0]]
        self._send(before, 0, stop_at_target=False)
        self.kept = {}

    def restart(self) -> None:
        """A checkpoint-restart ends this process: the newest copy (the state the failure
        struck) is evaluated and posted, after what :meth:`leave` sends."""
        self._refresh()
        newest = max((i for i in self.kept if i > self.ctl["acked"]), default=None)
        if newest is None:
            self.leave()
            return
        c = self.kept.pop(newest)
        assert self.scorer is not None  # copies are kept only where they can be scored
        ev = self.scorer.evaluate(c.params)
        self.leave((newest, ev))
        self.post(newest, c.logical, c.applied, ev)

    def _reaches(self, ev: Evaluation) -> bool:
        return (not self.ctl["reached"] and self.scorer is not None
                and self.scorer.reached(ev.metric, self.target))

    def _refresh(self) -> None:
        """Read what the controller says; answer its ask; drop what it evaluated."""
        self.ctl = get(self.store, KEY)
        self.kept = {i: k for i, k in self.kept.items() if i > self.ctl["acked"]}
        ask = self.ctl.get("ask")
        if ask and ask[0] > self.answered:
            n, after, before = ask
            self._send([i for i in sorted(self.kept) if after < i < before], n,
                       stop_at_target=True)
            self.answered = n

    def _send(self, iterations: list[int], ask: int, stop_at_target: bool) -> None:
        """Score the copies of ``iterations`` (oldest first; ``stop_at_target``: up to the
        first that reaches the target, where the look-back stops) and send the scores,
        in events of :data:`CHUNK` (``ask`` 0: unasked; else on the last one)."""
        scores: list[list[Any]] = []
        for i in iterations:
            c = self.kept[i]
            assert self.scorer is not None  # copies are kept only where they can be scored
            ev = self.scorer.evaluate(c.params)
            scores.append([i, c.logical, c.applied, ev.metric, ev.loss, dict(ev.extras)])
            if stop_at_target and self._reaches(ev):
                break
        if not scores and not ask:
            return
        chunks = [scores[k:k + CHUNK] for k in range(0, len(scores), CHUNK)] or [[]]
        for k, chunk in enumerate(chunks):
            post(self.store, Copies(id=ask if k == len(chunks) - 1 else 0, copies=chunk))

    def _post_copy(self, executed: int) -> None:
        c = self.kept.pop(executed)
        assert self.scorer is not None
        self.post(executed, c.logical, c.applied, self.scorer.evaluate(c.params))


class ControllerEvals:
    """The controller's side: record what the first member scored, look back when asked.

    ``copies``: the ranks keep look-back copies (a workload's run; a user's loop keeps
    none, so nothing is asked for).
    """

    def __init__(self, port: ControllerPort, copies: bool = True) -> None:
        self.port, self.ctx, self.copies = port, port.ctx, copies
        self.asked = 0
        # The evaluation waiting for its look-back, and what arrived after it.
        self.pending: tuple[Metrics, Evaluation] | None = None
        self.queue: list[Metrics] = []

    def start(self) -> None:
        """Set the key the ranks read (before any rank starts)."""
        self._publish(None)

    def on_metrics(self, m: Metrics) -> None:
        """The first member evaluated its replica."""
        it = m.iteration
        if m.final and self._seen(it):  # the last step was posted already
            return
        if self.pending is not None:
            self.queue.append(m)
            return
        ev = Evaluation(m.metric, m.loss, dict(m.extras))
        look_back = self.ctx.look_back(it, ev)
        if look_back and self.copies and self._missing(it):
            self.asked += 1
            self.pending = (m, ev)
            self._publish([self.asked, self.ctx.evals.scored, it])
            return
        self._score(m, ev, look_back)

    def on_copies(self, m: Copies) -> None:
        """Scores of copies the first member kept (asked for, or sent as it left): keep
        them; an answer to the ask under way releases the evaluation held back."""
        for it, logical, _applied, metric, loss, extras in m.copies:
            if self.ctx.result.iterations_to_target is None and it > self.ctx.evals.scored:
                self.ctx.keep(it, {}, scored=Evaluation(metric, loss, dict(extras)),
                              logical_iteration=logical, ranks=self.port.group_size)
        if self.pending is not None and m.id == self.asked:
            self.close()

    def close(self) -> None:
        """Record what is held back with what arrived (also when no answer can come)."""
        if self.pending is not None:
            m, ev = self.pending
            self.pending = None
            self._score(m, ev, look_back=True)
        while self.queue and self.pending is None:
            self.on_metrics(self.queue.pop(0))

    def _seen(self, iteration: int) -> bool:
        held = self.queue + ([self.pending[0]] if self.pending else [])
        return iteration <= self.ctx.evals.scored or any(
            e.iteration == iteration for e in held)

    def _missing(self, iteration: int) -> bool:
        """Whether iterations before ``iteration`` since the last evaluation lack a score."""
        have = {k.iteration for k in self.ctx.evals.gap(iteration)}
        return len(have) < iteration - self.ctx.evals.scored - 1

    def _score(self, m: Metrics, ev: Evaluation, look_back: bool) -> None:
        self.port.evaluate(m, ev, look_back=look_back)
        self._publish(None)

    def _publish(self, ask: list[int] | None) -> None:
        put(self.port.store, KEY, {"acked": self.ctx.evals.scored, "ask": ask,
                                   "reached": self.ctx.result.iterations_to_target is not None})
