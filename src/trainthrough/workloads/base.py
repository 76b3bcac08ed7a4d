"""The workload contract: an iterative-convergent algorithm as additive updates.

Training is ``x_{k+1} = x_k + u(x_k, data_k)``. A workload says how to build ``x_0``,
how to split its data over workers, how one worker computes its contribution to
``u`` from the parameters it pulled, and how to score parameters. It knows nothing
of shards, engines or failures: the parameter server owns ``x`` and applies updates.

Call order, per run (any engine):

1. ``init_params(gen)`` once;
2. ``partition(num_workers)`` once, then ``init_worker_state(...)`` per worker (again
   for a replacement worker: its in-memory state is gone);
3. per worker step: ``compute_update(params, shard, state, step)``; the engine sums
   or averages the workers' updates (``aggregate``) and the shard's optimizer applies
   them (``update_kind``: a gradient goes through the optimizer, a delta is added);
4. every few steps: ``evaluate(params)``.

Data-parallel engines (optional support, see :meth:`Workload.sample_count`) skip
``partition`` and ``compute_update``: every rank reads the whole training set, so
after ``init_params`` they call ``sample_count()`` once and then, per micro-batch of
the global mini-batch, ``compute_update_on(params, indices, seed)``. Rows are then
not tied to a rank, which is what lets survivors redo a lost rank's share.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from trainthrough.fields import Bounds

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class OptimizerSpec:
    """Server-side optimizer a shard runs on incoming updates.

    ``kind``: ``add`` (x += u, for algorithms that push deltas), ``sgd``, ``momentum``
    or ``adam`` (for gradients). ``lr`` is the step size; ``momentum`` and
    ``betas``/``eps`` apply to their kinds only.
    """

    kind: Literal["add", "sgd", "momentum", "adam"] = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass
class Evaluation:
    """A score of the parameters: the target metric, a loss, and anything else."""

    metric: float
    loss: float
    extras: dict[str, float] = field(default_factory=dict)


class Workload(ABC):
    """An iterative-convergent algorithm. Subclass and register it (see registry)."""

    name: str = "workload"
    description: str = ""
    metric_name: str = "metric"
    direction: Literal["max", "min"] = "max"
    default_target: float = 0.0
    has_target: bool = True  # False: no target (a user's loop without one); epochs end it
    update_kind: Literal["gradient", "delta"] = "gradient"
    aggregate: Literal["mean", "sum"] = "mean"
    default_optimizer: OptimizerSpec = OptimizerSpec()
    default_max_iterations: int = 1000
    default_eval_every: int = 10
    default_checkpoint_every: int = 100
    # Mini-batch of one worker (parameter server) or one rank (data parallel).
    batch_size: int = 32
    # Rough cost of one worker step in simulated seconds, before the cost model's
    # per-byte terms; engines charge it to the virtual clock.
    step_seconds: float = 0.01
    # Accepted values of the constructor's options beyond their annotated types,
    # checked before the workload is built (workloads/options.py).
    option_bounds: ClassVar[dict[str, Bounds]] = {}

    @abstractmethod
    def init_params(self, gen: torch.Generator) -> Params:
        """Initial parameters ``x_0`` (fresh tensors, float32 unless stated)."""

    @abstractmethod
    def partition(self, num_workers: int) -> list[Any]:
        """Split the training data into ``num_workers`` parts, one per worker.

        Raises:
            UserError: if the data cannot be split that many ways.
        """

    def init_worker_state(self, worker_id: int, data: Any, params: Params,
                          gen: torch.Generator) -> Any:
        """Worker-local state that is not a parameter (lost when the worker dies)."""
        return None

    @abstractmethod
    def compute_update(self, params: Params, data: Any, state: Any, step: int,
                       seed: int) -> Params:
        """One worker's update from the parameters it holds, at logical step ``step``.

        Must be deterministic given its arguments: mini-batches are chosen from
        ``step`` and any sampling seeds a generator from ``seed`` (which the engine
        derives from the run seed, the worker and the step), so a rolled-back run
        replays the same data. Returns a tensor per parameter it touches (full
        shape); parameters it leaves out get no update.
        """

    def rank_program(self) -> str | None:
        """The reference of a user's own training loop that data-parallel ranks run
        instead of this workload's step (:mod:`trainthrough.loop`); None for workloads
        whose model the driver holds."""
        return None

    def sample_count(self) -> int | None:
        """Training samples :meth:`compute_update_on` addresses (rows ``0..n-1``).

        ``None`` (the default) means the workload trains only through ``partition``
        and ``compute_update``: data-parallel engines refuse it with a clear error.
        """
        return None

    def compute_update_on(self, params: Params, indices: torch.Tensor, seed: int) -> Params:
        """The update on the training rows ``indices`` (1-D int64), for data parallelism.

        A gradient is the *mean* over those rows, so equal-sized micro-batches average
        to the gradient of their union. Must be deterministic given its arguments
        (``seed`` seeds dropout and the like); returns a tensor for every parameter.
        Implement it together with :meth:`sample_count`.
        """
        raise NotImplementedError(f"{self.name} does not implement compute_update_on")

    @abstractmethod
    def evaluate(self, params: Params) -> Evaluation:
        """Score parameters: the target metric plus a loss."""

    def reached(self, metric: float, target: float) -> bool:
        """Whether ``metric`` meets ``target`` in this workload's direction."""
        return metric >= target if self.direction == "max" else metric <= target

    def describe(self) -> dict[str, Any]:
        """Settings worth writing to ``config.toml`` (override to add yours)."""
        return {}
