"""The evaluation policy on gloo: the first member posts and keeps, the controller scores.

The parameters live in the ranks and the controller scores them
(:mod:`trainthrough.engines.evaluation` has the policy and what it guarantees). After
every committed step the group's first member (:class:`RankEvals`) asks the shared
:class:`~trainthrough.engines.evaluation.EvalPolicy` whether to post the replica
(``EVALUATE``), keep a copy in memory (``KEEP``) or neither. When an evaluation asks
for a look-back, the controller (:class:`ControllerEvals`) asks the first member for
its copies through the store and holds that evaluation, and every later one, back
until they are in. Call order (store key ``evalctl``, JSON, written by the controller):

1. the controller sets ``evalctl`` before any rank starts: ``acked`` (the last
   iteration evaluated: copies up to it are dropped), ``reached`` (the target is
   known: nothing more is kept) and ``ask`` (``[id, after, before]``: post your copies
   of the iterations strictly between, or null);
2. the first member reads it at every commit (one store round trip), answers an
   ``ask`` it has not answered with ``params`` events marked ``lookback: id`` and a
   ``lookback`` event closing them (what it had; possibly nothing), then posts or
   keeps this step as the policy says;
3. when the first member leaves the run (the end, or a checkpoint-restart), it posts
   every copy it still holds, unasked (``lookback: 0``), so a look-back asked later
   still finds them at the controller; on a restart the newest is posted for
   evaluation instead (the state the failure struck). After a re-formation the first
   commit posts the copy of the last commit before the failure, likewise.

Copies live in the first member only: a first member that dies takes them along,
and that look-back scores what the controller has (``target_resolution`` says how
exact the result is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch
import torch.distributed as dist

from trainthrough.engines.evaluation import EvalAction, EvalPolicy
from trainthrough.engines.gloo.protocol import get, post, put
from trainthrough.workloads.base import Evaluation

if TYPE_CHECKING:
    from trainthrough.engines.gloo.controller import GlooEngine

KEY = "evalctl"
Tensors = dict[str, torch.Tensor]


def _blob(params: Tensors) -> bytes:
    return safetensors.torch.save({n: v.contiguous() for n, v in params.items()})


class RankEvals:
    """The first member's side: which commits are posted, which kept, and look-backs."""

    def __init__(self, every: int, store: dist.Store) -> None:
        self.policy, self.store = EvalPolicy(every), store
        self.kept: dict[int, tuple[int, int, Tensors]] = {}  # executed -> (logical, applied, copy)
        self.last: int | None = None  # the executed count of this process's last commit
        self.disrupted: int | None = None
        self.answered = 0  # the last ask answered

    def after_commit(self, executed: int, logical: int, applied: int, params: Tensors,
                     recovered: bool, keep: bool = True) -> bool:
        """A step was committed: returns whether to post the replica for evaluation now.

        ``recovered``: this is the first commit after a recovery (the copy of the last
        commit before the failure, if kept, is posted first: the dip starts there).
        ``keep``: copies are useful (False when the rank scores its own model).
        """
        ctl = get(self.store, KEY)
        self._answer(ctl)
        self.kept = {i: k for i, k in self.kept.items() if i > ctl["acked"]}
        previous = executed - 1 if self.last is None else self.last
        if recovered:
            self.disrupted = previous
            if previous in self.kept:
                self._post(previous, *self.kept.pop(previous), lookback=None)
        self.last = executed
        action = self.policy.decide(executed, previous, bool(ctl["reached"]), self.disrupted)
        if action is EvalAction.KEEP and keep:
            self.kept[executed] = (logical, applied,
                                   {n: v.detach().clone() for n, v in params.items()})
        return action is EvalAction.EVALUATE

    def leave(self, restart: bool = False) -> None:
        """This process leaves the run: answer a pending ask, and post every copy left
        (on a ``restart``, the newest for evaluation: the state the failure struck)."""
        ctl = get(self.store, KEY)
        self._answer(ctl)
        left = sorted(i for i in self.kept if i > ctl["acked"])
        for it in left:
            self._post(it, *self.kept[it], lookback=None if restart and it == left[-1] else 0)
        self.kept = {}

    def _answer(self, ctl: dict[str, Any]) -> None:
        ask = ctl.get("ask")
        if not ask or ask[0] <= self.answered:
            return
        n, after, before = ask
        sent = sorted(i for i in self.kept if after < i < before)
        for it in sent:
            self._post(it, *self.kept[it], lookback=n)
        post(self.store, {"type": "lookback", "id": n, "iterations": sent})
        self.answered = n

    def _post(self, executed: int, logical: int, applied: int, params: Tensors,
              lookback: int | None) -> None:
        event: dict[str, Any] = {"type": "params", "iteration": executed, "logical": logical,
                                 "final": False, "applied": applied}
        if lookback is not None:
            event["lookback"] = lookback
        post(self.store, event, _blob(params))


class ControllerEvals:
    """The controller's side: score what the first member posts, look back when asked."""

    def __init__(self, engine: GlooEngine) -> None:
        self.e, self.ctx = engine, engine.ctx
        self.asked = 0
        # The evaluation waiting for its look-back, and what arrived after it.
        self.pending: tuple[dict[str, Any], Tensors, Evaluation] | None = None
        self.queue: list[tuple[dict[str, Any], Tensors]] = []

    def start(self) -> None:
        """Set the key the ranks read (before any rank starts)."""
        self._publish(None)

    def on_params(self, event: dict[str, Any], params: Tensors) -> None:
        """Parameters posted by the first member: a copy (kept) or an evaluation."""
        if "lookback" in event:  # a copy, asked for or left behind
            it = int(event["iteration"])
            if self.ctx.result.iterations_to_target is None and it > self.ctx.evals.scored:
                self.ctx.keep(it, params, logical_iteration=int(event["logical"]),
                              ranks=len(self.e.rec.members))
            return
        it = int(event["iteration"])
        if event["final"] and self._seen(it):  # the last step was posted already
            return
        if self.pending is not None:
            self.queue.append((event, params))
            return
        ev = self.ctx.score(params)
        look_back = self.ctx.look_back(it, ev)
        if look_back and self._missing(it):
            self.asked += 1
            self.pending = (event, params, ev)
            self._publish([self.asked, self.ctx.evals.scored, it])
            return
        self._score(event, params, ev, look_back)

    def on_lookback(self, event: dict[str, Any]) -> None:
        """The first member answered an ask: score the evaluation held back."""
        if self.pending is not None and int(event["id"]) == self.asked:
            self.close()

    def close(self) -> None:
        """Score what is held back with what arrived (also when no answer can come)."""
        if self.pending is not None:
            event, params, ev = self.pending
            self.pending = None
            self._score(event, params, ev, look_back=True)
        while self.queue and self.pending is None:
            self.on_params(*self.queue.pop(0))

    def _seen(self, iteration: int) -> bool:
        held = [e for e, _ in self.queue] + ([self.pending[0]] if self.pending else [])
        return iteration <= self.ctx.evals.scored or any(
            int(e["iteration"]) == iteration for e in held)

    def _missing(self, iteration: int) -> bool:
        """Whether iterations before ``iteration`` since the last evaluation lack a copy."""
        have = {k.iteration for k in self.ctx.evals.gap(iteration)}
        return len(have) < iteration - self.ctx.evals.scored - 1

    def _score(self, event: dict[str, Any], params: Tensors, ev: Evaluation,
               look_back: bool) -> None:
        self.e._evaluate(event, params, ev, look_back=look_back)
        self._publish(None)

    def _publish(self, ask: list[int] | None) -> None:
        put(self.e.store, KEY, {"acked": self.ctx.evals.scored, "ask": ask,
                                "reached": self.ctx.result.iterations_to_target is not None})
