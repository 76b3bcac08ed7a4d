"""Evaluation where the parameters are: the first rank scores, only scores travel.

The first member of a data-parallel group (engines/gloo/evals.py) evaluates its replica
and its look-back copies in place and posts numbers; the controller records them with
the shared policy (engines/evaluation.py). Driven here on an in-process store, without
processes. The copies held are bounded by bytes (``lookback_bytes``), on every engine.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import torch.distributed as dist

from trainthrough.config import RunConfig
from trainthrough.engines.evaluation import EvalPolicy, Evaluations, Kept
from trainthrough.engines.gloo.evals import KEY, RankEvals
from trainthrough.engines.gloo.messages import Copies, Message, Metrics, parse
from trainthrough.engines.gloo.protocol import put
from trainthrough.lab.runner import run_silent
from trainthrough.workloads.base import Evaluation

COPY = 4 * 1000  # bytes of one copy of the stand-in model below


class Scores:
    """A stand-in workload: the metric of parameters ``w`` is ``w[0]``, to maximize;
    counts what it scored."""

    def __init__(self) -> None:
        self.scored: list[float] = []

    def evaluate(self, params: dict[str, torch.Tensor]) -> Evaluation:
        self.scored.append(float(params["w"][0]))
        return Evaluation(float(params["w"][0]), 0.0, {"extra": 1.0})

    def reached(self, metric: float, target: float) -> bool:
        return metric >= target


def _params(i: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((1000,), float(i))}


def _posted(store: dist.Store) -> list[Message]:
    return [parse(json.loads(store.get(f"evq/{i}"))) for i in range(store.add("evq", 0))]


def _rank(keep_bytes: int = 100 * COPY, target: float = 100.0
          ) -> tuple[RankEvals, dist.Store, Scores]:
    store = dist.HashStore()
    put(store, KEY, {"acked": -1, "reached": False, "ask": None})
    scores = Scores()
    return RankEvals(EvalPolicy(10, keep_bytes=keep_bytes), store, scores, target), store, scores


def _commit(ev: RankEvals, upto: int, start: int = 1) -> list[int]:
    """Commit iterations ``start..upto``; the ones the policy evaluates (posted here)."""
    evaluated = []
    for i in range(start, upto + 1):
        if ev.after_commit(i, i, 2 * i, _params(i), recovered=False):
            ev.post(i, i, 2 * i, ev.scorer.evaluate(_params(i)))  # type: ignore[union-attr]
            evaluated.append(i)
    return evaluated


def test_the_first_rank_keeps_copies_within_the_byte_budget_oldest_first() -> None:
    ev, store, scores = _rank(keep_bytes=3 * COPY)
    assert _commit(ev, 9) == []
    assert sorted(ev.kept) == [1, 2, 3]  # 4..9 do not fit beside them
    assert scores.scored == []  # a copy is scored only when a look-back asks
    assert EvalPolicy(10, keep_bytes=0).fits(0, 1) is False
    assert EvalPolicy(10, keep_bytes=COPY).fits(0, COPY) is True


def test_an_ask_is_answered_with_scores_up_to_the_first_that_reaches_the_target() -> None:
    ev, store, scores = _rank(target=4.0)
    assert _commit(ev, 10) == [10]
    [m] = _posted(store)
    assert isinstance(m, Metrics) and (m.iteration, m.metric, m.applied) == (10, 10.0, 20)
    assert m.extras == {"extra": 1.0}  # the workload's extras travel with the scores
    # The controller found the target reached at 10 and asks for what lies before it.
    put(store, KEY, {"acked": -1, "reached": False, "ask": [1, 0, 10]})
    # Read at the next regular evaluation (no store round trip at every commit), and
    # answered before it: the controller holds its evaluations back until then.
    assert _commit(ev, 20, start=11) == [20]
    _, answer, m20 = _posted(store)
    assert isinstance(answer, Copies) and answer.id == 1 and isinstance(m20, Metrics)
    # Oldest first, stopping where the controller's look-back stops: at 4.
    assert [c[0] for c in answer.copies] == [1, 2, 3, 4]
    assert answer.copies[0] == [1, 1, 2, 1.0, 0.0, {"extra": 1.0}]
    assert scores.scored == [10.0, 1.0, 2.0, 3.0, 4.0, 20.0]
    _commit(ev, 22, start=21)
    assert len(_posted(store)) == 3  # answered once


def test_a_leaving_first_rank_scores_what_a_look_back_may_still_ask_for() -> None:
    ev, store, scores = _rank()
    _commit(ev, 13)  # evaluated 10, kept 1..9 and 11..13; the controller acked nothing yet
    ev.leave()
    [_, left] = _posted(store)
    # Unasked (0): every copy before the evaluation in flight (10), none after it.
    assert isinstance(left, Copies) and left.id == 0
    assert [c[0] for c in left.copies] == list(range(1, 10))
    assert ev.kept == {}


def test_a_restart_evaluates_the_state_the_failure_struck() -> None:
    ev, store, scores = _rank(target=12.0)
    _commit(ev, 13)
    put(store, KEY, {"acked": 10, "reached": False, "ask": None})  # 10 was recorded
    ev.restart()
    *_, left, last = _posted(store)
    # The newest copy (13) reaches the target: the copies before it go first, scored.
    assert isinstance(last, Metrics) and last.iteration == 13 and not last.final
    assert isinstance(left, Copies) and [c[0] for c in left.copies] == [11, 12]


def test_copies_are_bounded_by_bytes_on_every_engine() -> None:
    e = Evaluations(EvalPolicy(10, keep_bytes=2 * COPY))
    for i in range(1, 5):
        e.keep(Kept(i, _params(i), 0.0, 0.0, {}))
    assert [k.iteration for k in e.kept] == [1, 2]
    assert e.keep(Kept(5, {}, 0.0, 0.0, {}, scored=Evaluation(5.0, 0.0)))  # a score: no bytes
    kw: dict[str, Any] = dict(workload="ridge", target=0.2, eval_every=10, seed=0)
    exact = run_silent(RunConfig(**kw))
    bounded = run_silent(RunConfig(lookback_bytes=0, **kw))
    assert exact.extras["target_resolution"] == 1
    # Nothing kept: the first evaluation that reaches it, reported as that inexact.
    assert bounded.iterations_to_target % 10 == 0
    assert bounded.iterations_to_target - bounded.extras["target_resolution"] \
        < exact.iterations_to_target <= bounded.iterations_to_target


@pytest.mark.parametrize("size", [-1])
def test_lookback_bytes_is_checked(size: int) -> None:
    from trainthrough.errors import UserError

    with pytest.raises(UserError, match="lookback"):
        RunConfig(lookback_bytes=size).validate()
