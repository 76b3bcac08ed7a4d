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
   known: nothing more is kept) and ``ask`` (``[id, after, before]``: send your copies
   of the iterations strictly between, or null);
2. the first member reads it at its regular evaluations, after a recovery and, while
   an ask stands, at every commit (one store round trip each); it answers an ask it
   has not answered with one ``copies`` event (every copy it has in the range, in one
   safetensors blob; possibly none), then posts or keeps its step as the policy says;
3. when the first member leaves the run (the end, or a checkpoint-restart), it sends
   every copy it still holds, unasked (``id`` 0), so a look-back asked later still
   finds them at the controller; on a restart the newest is posted for evaluation
   instead (the state the failure struck). After a re-formation the first commit
   posts the copy of the last commit before the failure, likewise.

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
from trainthrough.engines.gloo.messages import Copies, Params
from trainthrough.engines.gloo.protocol import get, post, put
from trainthrough.workloads.base import Evaluation

if TYPE_CHECKING:
    from trainthrough.engines.gloo.port import ControllerPort

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
        self.ctl: dict[str, Any] = {"acked": -1, "reached": False, "ask": None}

    def after_commit(self, executed: int, logical: int, applied: int, params: Tensors,
                     recovered: bool, keep: bool = True) -> bool:
        """A step was committed: returns whether to post the replica for evaluation now.

        ``recovered``: this is the first commit after a recovery (the copy of the last
        commit before the failure, if kept, is posted first: the dip starts there).
        ``keep``: copies are useful (False when the rank scores its own model).
        """
        previous = executed - 1 if self.last is None else self.last
        self.last = executed
        p = self.policy
        if recovered or self.ctl["ask"] is not None or executed // p.every > previous // p.every:
            self._refresh()  # at regular evaluations, after recoveries, while asked
        if recovered:
            self.disrupted = previous
            if previous in self.kept:
                self._post(previous, *self.kept.pop(previous))
        action = p.decide(executed, previous, bool(self.ctl["reached"]), self.disrupted)
        if action is EvalAction.KEEP and keep:
            self.kept[executed] = (logical, applied,
                                   {n: v.detach().clone() for n, v in params.items()})
        return action is EvalAction.EVALUATE

    def leave(self, restart: bool = False) -> None:
        """This process leaves the run: answer a pending ask, and send every copy left
        (on a ``restart``, the newest is posted for evaluation: the state the failure
        struck)."""
        self._refresh()
        left = sorted(i for i in self.kept if i > self.ctl["acked"])
        if restart and left:
            self._post(left[-1], *self.kept.pop(left[-1]))
            left.pop()
        self._send(left, 0)
        self.kept = {}

    def _refresh(self) -> None:
        """Read what the controller says; answer its ask; drop what it evaluated."""
        self.ctl = get(self.store, KEY)
        self.kept = {i: k for i, k in self.kept.items() if i > self.ctl["acked"]}
        ask = self.ctl.get("ask")
        if ask and ask[0] > self.answered:
            n, after, before = ask
            self._send([i for i in sorted(self.kept) if after < i < before], n)
            self.answered = n

    def _send(self, iterations: list[int], ask: int) -> None:
        """The copies of ``iterations`` in one event (``ask`` 0: unasked)."""
        if not iterations and not ask:
            return
        copies = [[i, *self.kept[i][:2]] for i in iterations]
        tensors = {f"{i}/{n}": v for i in iterations for n, v in self.kept[i][2].items()}
        post(self.store, Copies(id=ask, copies=copies), _blob(tensors))

    def _post(self, executed: int, logical: int, applied: int, params: Tensors) -> None:
        post(self.store, Params(iteration=executed, logical=logical, final=False,
                                applied=applied), _blob(params))


class ControllerEvals:
    """The controller's side: score what the first member posts, look back when asked."""

    def __init__(self, port: ControllerPort) -> None:
        self.port, self.ctx = port, port.ctx
        self.asked = 0
        # The evaluation waiting for its look-back, and what arrived after it.
        self.pending: tuple[Params, Tensors, Evaluation] | None = None
        self.queue: list[tuple[Params, Tensors]] = []

    def start(self) -> None:
        """Set the key the ranks read (before any rank starts)."""
        self._publish(None)

    def on_params(self, event: Params, params: Tensors) -> None:
        """Parameters the first member posted for evaluation."""
        it = event.iteration
        if event.final and self._seen(it):  # the last step was posted already
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

    def on_copies(self, event: Copies, tensors: Tensors) -> None:
        """Copies the first member sent (asked for, or left behind): keep them; an answer
        to the ask under way releases the evaluation held back."""
        for it, logical, _applied in event.copies:
            if self.ctx.result.iterations_to_target is None and it > self.ctx.evals.scored:
                prefix = f"{it}/"
                params = {n[len(prefix):]: v for n, v in tensors.items() if n.startswith(prefix)}
                self.ctx.keep(it, params, logical_iteration=logical,
                              ranks=self.port.group_size)
        if self.pending is not None and event.id == self.asked:
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
            e.iteration == iteration for e in held)

    def _missing(self, iteration: int) -> bool:
        """Whether iterations before ``iteration`` since the last evaluation lack a copy."""
        have = {k.iteration for k in self.ctx.evals.gap(iteration)}
        return len(have) < iteration - self.ctx.evals.scored - 1

    def _score(self, event: Params, params: Tensors, ev: Evaluation,
               look_back: bool) -> None:
        self.port.evaluate(event, params, ev, look_back=look_back)
        self._publish(None)

    def _publish(self, ask: list[int] | None) -> None:
        put(self.port.store, KEY, {"acked": self.ctx.evals.scored, "ask": ask,
                                "reached": self.ctx.result.iterations_to_target is not None})
