"""A user's training loop as the run's workload: what the driver knows of it.

The model lives in the ranks only (the user's ``train`` builds it), so this workload
describes the run (name, metric, direction, target, evaluation and checkpoint
intervals) and names the program the ranks run (:meth:`LoopWorkload.rank_program`);
everything that would need the model on the driver refuses, naming the engines that
run a loop.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

from trainthrough.errors import UserError
from trainthrough.loop.api import TrainingLoop
from trainthrough.workloads.base import Evaluation, Params, Workload


class LoopWorkload(Workload):
    """The run's view of a :class:`~trainthrough.loop.api.TrainingLoop` named ``ref``."""

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
