"""Plug in your own PyTorch model: :class:`TorchWorkload`.

Give it an ``nn.Module``, training and test data, a loss and a metric, and it
becomes a workload every engine and strategy can run: the module's parameters
become the parameter-server keys (named as in ``model.named_parameters()``), each
worker pushes the gradient of the loss on its mini-batch, and the shards run the
optimizer you name. Register it to use it from the command line and suites::

    import torch
    import torch.nn.functional as F
    from torch import nn
    from trainthrough.workloads import OptimizerSpec, register
    from trainthrough.workloads.custom import TorchWorkload

    def make(seed: int, batch_size: int = 64) -> TorchWorkload:
        x, y = torch.randn(2000, 20), torch.randint(0, 3, (2000,))
        model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))
        return TorchWorkload(model, (x[:1600], y[:1600]), (x[1600:], y[1600:]),
                             loss_fn=F.cross_entropy, metric="accuracy", target=0.4,
                             optimizer=OptimizerSpec(kind="adam", lr=1e-3),
                             batch_size=batch_size, seed=seed, name="mymodel")

    register("mymodel", make, "my 2-layer MLP")

The module is only a skeleton: it is called through ``torch.func.functional_call``
with the parameters the worker pulled, so the module's own weights are never
trained or shared between workers. Buffers (e.g. BatchNorm running statistics) are
not parameters: they are neither synchronized nor recovered, so prefer models
without them (GroupNorm/LayerNorm instead of BatchNorm).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.utils.data import Dataset

from trainthrough.errors import UserError
from trainthrough.workloads._data import BatchSchedule, check_batches, split_rows
from trainthrough.workloads.base import Evaluation, OptimizerSpec, Params, Workload

Data = tuple[torch.Tensor, torch.Tensor] | Dataset
MetricFn = Callable[[torch.Tensor, torch.Tensor], float]


@dataclass
class _Part:
    x: torch.Tensor
    y: torch.Tensor
    batches: BatchSchedule


def _tensors(data: Data, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets as two tensors; a Dataset is materialized once, in memory."""
    if isinstance(data, tuple):
        x, y = data
    else:
        items = [data[i] for i in range(len(data))]  # type: ignore[arg-type]
        x = torch.stack([torch.as_tensor(a) for a, _ in items])
        y = torch.stack([torch.as_tensor(b) for _, b in items])
    if len(x) != len(y) or len(x) == 0:
        raise UserError(f"{what}: need as many targets as inputs, and at least one "
                        f"(got {len(x)} inputs, {len(y)} targets)")
    return x, y


class TorchWorkload(Workload):
    """Mini-batch training of any ``nn.Module``, workers pushing gradients.

    Args:
        model: skeleton module; its architecture is used, and its default
            initialization (``reset_parameters``) when ``reinit`` is true.
        train, test: ``(inputs, targets)`` tensors or a map-style ``Dataset``.
        loss_fn: ``loss_fn(outputs, targets)``, mean-reduced.
        metric: ``"accuracy"`` (argmax of outputs), ``"loss"``, or a function
            ``metric(outputs, targets) -> float`` over the whole test set.
        direction: ``"max"`` or ``"min"``; defaults from ``metric`` when named.
        target: the metric value a run has to reach.
        optimizer: the shards' optimizer for the (averaged) gradients.
        reinit: start each run from a fresh initialization drawn from the run's
            generator (true) or from the module's current weights (false, for
            fine-tuning).
    """

    update_kind = "gradient"
    aggregate = "mean"

    def __init__(self, model: nn.Module, train: Data, test: Data,
                 loss_fn: Callable[..., torch.Tensor] = F.cross_entropy,
                 metric: Literal["accuracy", "loss"] | MetricFn = "accuracy",
                 direction: Literal["max", "min"] | None = None, target: float = 0.9,
                 optimizer: OptimizerSpec | None = None, batch_size: int = 32,
                 seed: int = 0, reinit: bool = True, name: str = "torch",
                 max_iterations: int = 1000, eval_every: int = 10,
                 step_seconds: float = 0.01) -> None:
        if not callable(metric) and metric not in ("accuracy", "loss"):
            raise UserError(f"{name}: metric must be 'accuracy', 'loss' or a function, "
                            f"got {metric!r}")
        if direction is None:
            if callable(metric):
                raise UserError(f"{name}: give direction='max' or 'min' for a metric function")
            direction = "max" if metric == "accuracy" else "min"
        self.model, self.loss_fn, self.metric = model, loss_fn, metric
        self.x_train, self.y_train = _tensors(train, f"{name} train")
        self.x_test, self.y_test = _tensors(test, f"{name} test")
        self.name, self.direction, self.default_target = name, direction, target
        self.metric_name = metric if isinstance(metric, str) else "metric"
        self.default_optimizer = optimizer or OptimizerSpec(kind="adam", lr=1e-3)
        self.batch_size, self.seed, self.reinit = batch_size, seed, reinit
        self.default_max_iterations, self.default_eval_every = max_iterations, eval_every
        self.step_seconds = step_seconds

    def init_params(self, gen: torch.Generator) -> Params:
        model = self.model
        if self.reinit:
            # Modules initialize from the global RNG; seed it from the run's generator
            # inside fork_rng so the caller's global RNG state is left untouched.
            seed = int(torch.randint(2**62, (1,), generator=gen))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = copy.deepcopy(model)
                for m in model.modules():
                    reset = getattr(m, "reset_parameters", None)
                    if callable(reset):
                        reset()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    def partition(self, num_workers: int) -> list[Any]:
        n = len(self.y_train)
        check_batches(self.name, n, self.batch_size, num_workers)
        return [_Part(self.x_train[s], self.y_train[s],
                      BatchSchedule(s.stop - s.start, self.batch_size, self.seed * 7919 + i))
                for i, s in enumerate(split_rows(n, num_workers))]

    def compute_update(self, params: Params, data: Any, state: Any, step: int,
                       seed: int) -> Params:
        idx = data.batches.indices(step)
        return self._gradient(params, data.x[idx], data.y[idx], seed)

    def sample_count(self) -> int:
        return len(self.y_train)

    def compute_update_on(self, params: Params, indices: torch.Tensor, seed: int) -> Params:
        return self._gradient(params, self.x_train[indices], self.y_train[indices], seed)

    def _gradient(self, params: Params, x: torch.Tensor, y: torch.Tensor, seed: int) -> Params:
        """Gradient of the (mean) loss on ``x, y`` with respect to every parameter."""
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        # Seed the global RNG for this step only, so dropout and the like replay
        # identically after a rollback.
        with torch.random.fork_rng(devices=[]):
            # The CPU generator only: torch.manual_seed also seeds every accelerator
            # backend, a sizeable share of a small model's step.
            torch.default_generator.manual_seed(seed)
            out = functional_call(self.model, leaves, (x,))
            loss = self.loss_fn(out, y)
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        return {k: torch.zeros_like(v) if g is None else g
                for (k, v), g in zip(leaves.items(), grads)}

    @torch.no_grad()
    def evaluate(self, params: Params, chunk: int = 2048) -> Evaluation:
        outs = [functional_call(self.model, params, (self.x_test[i:i + chunk],))
                for i in range(0, len(self.y_test), chunk)]
        out = torch.cat(outs)
        loss = float(self.loss_fn(out, self.y_test))
        if self.metric == "accuracy":
            value = float((out.argmax(1) == self.y_test).float().mean())
        elif self.metric == "loss":
            value = loss
        else:
            value = float(self.metric(out, self.y_test))  # type: ignore[operator]
        return Evaluation(metric=value, loss=loss)

    def describe(self) -> dict[str, Any]:
        n_params = sum(p.numel() for p in self.model.parameters())
        return {"batch_size": self.batch_size, "metric": self.metric_name,
                "parameters": n_params, "reinit": self.reinit}
