"""A user's epoch and evaluation callbacks, called once per committed epoch or step.

``loop.attach(..., on_epoch_end=fn, on_eval=fn)``: ``on_epoch_end(epoch)`` after the
last step of each epoch (a scheduler stepped per epoch, an evaluation per epoch),
``on_eval(step)`` after every ``every``-th committed step, on every rank alike.

They run at the start of the next step, before its first micro-batch (and when the
loop ends), never inside a step that could be rolled back: what they changed
belongs to the committed state. Which of them ran is counted in the replica's state
(``meta/epochs_ended``, ``meta/evals_done``), which every checkpoint and every joiner
carries: so a step redone after a rollback runs none again, a joiner runs the same
ones as its peers from then on, and a rank restarted from a checkpoint replays
exactly the ones that ran after it was written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch


@dataclass
class Hooks:
    """The callbacks and how many of each ran (``every``: steps between evaluations)."""

    on_epoch_end: Callable[[int], object] | None = None
    on_eval: Callable[[int], object] | None = None
    every: int = 1
    epochs_ended: int = 0
    evals_done: int = 0

    def before(self, epoch: int, committed: int, seed: int) -> None:
        """Run what is due before a step of ``epoch`` after ``committed`` steps: the end
        of every earlier epoch, the evaluation of a multiple of :attr:`every` steps.

        ``seed``: the draws the callbacks make are the same on every rank.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            while self.epochs_ended < epoch:
                if self.on_epoch_end is not None:
                    self.on_epoch_end(self.epochs_ended)
                self.epochs_ended += 1
            while (self.evals_done + 1) * self.every <= committed:
                self.evals_done += 1
                if self.on_eval is not None and self.evals_done * self.every == committed:
                    self.on_eval(committed)

    def state(self) -> dict[str, torch.Tensor]:
        return {"meta/epochs_ended": torch.tensor([self.epochs_ended], dtype=torch.int64),
                "meta/evals_done": torch.tensor([self.evals_done], dtype=torch.int64)}

    def load(self, tensors: Mapping[str, torch.Tensor]) -> None:
        for key in ("epochs_ended", "evals_done"):
            t = tensors.get(f"meta/{key}")
            setattr(self, key, int(t[0]) if t is not None else 0)
