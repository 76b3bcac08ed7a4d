"""A user's own training loop as a workload: the marker, and the run's view of it.

:class:`TrainingLoop` is what ``@trainthrough.loop.training_loop`` turns a user's
``train(loop)`` into: the function, what its metric is, and the rank program that runs
it. It describes a workload (a loop is also a workload reference:
``--workload file.py:train``), so it lives in this layer, next to the other workloads,
and needs nothing of the layers above: :func:`~trainthrough.workloads.make_workload`
and the run's validation recognise it without importing :mod:`trainthrough.loop`.

:class:`LoopWorkload` is the driver's view of one. The model lives in the ranks only
(the user's ``train`` builds it), so it describes the run (name, metric, direction,
target, evaluation and checkpoint intervals) and names the loop the ranks run
(:meth:`LoopWorkload.rank_program`); everything that would need the model on the driver
refuses, naming the engines that run a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import torch

from trainthrough.errors import UserError
from trainthrough.workloads.base import Evaluation, Params, Workload

#: ``train(loop, **options)``: the loop handle is :class:`trainthrough.loop.Loop`, which this
#: layer does not know.
TrainFn = Callable[..., Any]


@dataclass(frozen=True)
class TrainingLoop:
    """A user's training function, marked by :func:`trainthrough.loop.training_loop`.

    ``rank_entry`` is the ``module:function`` each rank process runs with its spec and
    store (``trainthrough.loop.rank:run_loop``); the marker carries it so that the
    engines start it by that name, never by an import of the layer above them.
    ``metric``/``direction``/``target`` describe what ``evaluate`` (given to
    ``Loop.attach``) returns; without ``evaluate`` the metric is the first rank's
    training loss on its share of the step.
    """

    fn: TrainFn
    rank_entry: str
    metric: str = "loss"
    direction: Literal["max", "min"] = "min"
    target: float | None = None
    eval_every: int = 10
    checkpoint_every: int = 50

    def __call__(self, loop: Any, **options: Any) -> Any:
        """Run the loop; ``options``: the run's ``workload_options`` (``--option``,
        ``launch(options=...)``), checked against ``fn``'s parameters after ``loop``."""
        return self.fn(loop, **options)

    @property
    def __name__(self) -> str:  # noqa: A003 - what references and messages name
        return self.fn.__name__


class LoopWorkload(Workload):
    """The run's view of a :class:`TrainingLoop` named ``ref``."""

    def __init__(self, ref: str, marked: TrainingLoop) -> None:
        self.ref = ref
        self.name = ref
        self.description = f"your training loop {marked.__name__}"
        self.metric_name, self.direction = marked.metric, marked.direction
        # No target: never reached (the loop's epochs end the run).
        self.has_target = marked.target is not None
        self.default_target = marked.target if marked.target is not None else 0.0
        self.default_eval_every = marked.eval_every
        self.default_checkpoint_every = marked.checkpoint_every
        self.default_max_iterations = 10**9  # the loop's epochs end it

    def reached(self, metric: float, target: float) -> bool:
        return self.has_target and super().reached(metric, target)

    def rank_program(self) -> str | None:
        return self.ref

    def _refuse(self) -> NoReturn:
        raise UserError(f"{self.ref} is your own training loop: it runs data parallel on the "
                        "ray and gloo engines only (--paradigm dp --engine ray|gloo)")

    def init_params(self, gen: torch.Generator) -> Params:
        self._refuse()

    def partition(self, num_workers: int) -> list[Any]:
        self._refuse()

    def compute_update(self, params: Params, data: Any, state: Any, step: int,
                       seed: int) -> Params:
        self._refuse()

    def evaluate(self, params: Params) -> Evaluation:
        self._refuse()
