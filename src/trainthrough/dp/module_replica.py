"""A user's own ``nn.Module`` and optimizer as a data-parallel replica.

The step routine (:mod:`trainthrough.dp.step`) works on a replica that computes one
flat gradient per micro-batch, applies a reduced one and saves or loads its state
(:class:`~trainthrough.dp.rank.Rank` does it for a :class:`~trainthrough.workloads.base.Workload`).
:class:`ModuleReplica` does the same for a model, an optimizer and a loss function
that stay the user's: the gradient is ``torch.autograd.grad`` of their loss, the update
is their optimizer's ``step()``, so every recovery, checkpoint and injection point of
the project applies to their loop unchanged.

Model buffers (BatchNorm's running statistics) are synchronized, not refused: each
micro-batch runs from the buffers of the last committed step, the floating buffers it
leaves behind travel in the allreduce after the gradient, and every rank sets them to
their mean over the global batch (the running statistics of one update with the mean
batch statistics; integer counters advance by one per step). So replicas stay
identical, and a rollback or a joining rank finds the buffers of the committed step.

State travels as flat tensors (``params/``, ``buffers/``, ``optim/state/<i>/<key>``,
``optim/group/<g>/<key>``, ``meta/steps``; the user's registered objects under
``user/<name>/`` (:mod:`~trainthrough.dp.user_state`) and the callbacks' counts,
``meta/epochs_ended`` and ``meta/evals_done`` (:mod:`~trainthrough.dp.hooks`)):
safetensors on disk and over the network, never a pickle.

The update is the user's optimizer step, or their own step (:attr:`StepFns.update`:
clipping, a GradScaler, schedulers) on the averaged gradient, run only once the group
committed it. Which buckets were reduced is the step's bookkeeping
(:class:`~trainthrough.dp.step.InFlight`), never read from the values: a NaN or inf is
the user's, skipped by their registered GradScaler or, without one, the end of the run
in one line.

The replica computes where the model lives (:attr:`ModuleReplica.device`, its
parameters' device): each batch the ``collate_fn`` made is moved there
(:func:`~trainthrough.dp.devices.to_device`, as ``DistributedDataParallel`` moves its
inputs), and the flat gradient is built, reduced and applied there. State is handed
out on that device and loaded onto it from any device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainthrough.dp import user_state
from trainthrough.dp.allreduce import Contribution
from trainthrough.dp.batching import MicroBatch
from trainthrough.dp.devices import to_device
from trainthrough.dp.hooks import Hooks
from trainthrough.dp.rank import Tensors, micro_seed
from trainthrough.errors import UserError

LossFn = Callable[[Any], torch.Tensor]
Update = Callable[[], object]  # what it returns is not read
Fetch = Callable[[torch.Tensor], Any]
_NUM = "#num"  # suffix of optimizer state entries that were plain numbers


@dataclass(frozen=True)
class StepFns:
    """The user's side of a step, as ``loop.step(loss_fn, update)`` hands it over.

    Attributes:
        loss_fn: ``loss_fn(batch)``, the scalar loss of one micro-batch.
        update: the user's own step on the averaged gradients (clip, a GradScaler, a
            scheduler, an EMA); None: ``opt.step()``.
    """

    loss_fn: LossFn
    update: Update | None = None


@dataclass(frozen=True)
class Flat:
    """The length of the flat vector the allreduce carries (gradient, then buffers)."""

    numel: int


class ModuleReplica:
    """One rank's view of the user's model: gradients, updates and state as the step needs.

    Call order per step (as for :class:`~trainthrough.dp.rank.Rank`), after the host's
    :meth:`begin_step` with the user's :class:`StepFns`: :meth:`gradients`, the
    allreduce outside, then :meth:`apply`; :attr:`losses` holds the step's losses. ``gradients`` leaves the model as it found it, so a step that
    fails before its update needs no undo.
    """

    def __init__(self, rank_id: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
                 fetch: Fetch, run_seed: int, registered: Mapping[str, Any] | None = None,
                 hooks: Hooks | None = None) -> None:
        self.rank_id, self.model, self.opt = rank_id, model, opt
        self.fetch, self.run_seed = fetch, run_seed
        self._fns: StepFns | None = None  # begin_step's, until the next one
        self.registered = user_state.check(registered or {})
        self._scalers = [o for o in self.registered.values()
                         if isinstance(o, torch.amp.GradScaler) and o.is_enabled()]
        self.hooks = hooks or Hooks()
        self._params = dict(model.named_parameters())
        trained = [p for p in self._params.values() if p.requires_grad]
        in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
        if not trained or any(id(p) not in in_opt for p in trained):
            raise UserError("the optimizer must hold every trainable parameter of the model "
                            "(build it from model.parameters())")
        bufs = dict(model.named_buffers())
        self._float_bufs = {n: b for n, b in bufs.items() if b.is_floating_point()}
        self._int_bufs = {n: b for n, b in bufs.items() if not b.is_floating_point()}
        devices = {p.device for p in self._params.values()}
        if len(devices) > 1:
            raise UserError("the model's parameters are on several devices "
                            f"({', '.join(sorted(map(str, devices)))}): a data-parallel "
                            "replica lives on one; move the model with model.to(device)")
        self.device: torch.device = devices.pop()
        # Dropout on a GPU draws from that device's generator: forked and seeded too.
        self._rng_devices = [self.device] if self.device.type == "cuda" else []
        self._grad_numel = sum(p.numel() for p in self._params.values())
        self.layout = Flat(self._grad_numel + sum(b.numel() for b in self._float_bufs.values()))
        self.steps = 0
        #: This rank's micro-batch losses since :meth:`begin_step` (a rolled-back step
        #: adds its micro-batches again: the last ones are the committed attempt's).
        self.losses: list[float] = []
        self.label = type(model).__name__

    # -- training ---------------------------------------------------------------
    def begin_step(self, fns: StepFns) -> list[float]:
        """Take the user's functions for the coming step and empty :attr:`losses`.

        They stay until the next call: a recovery inside the step (a rollback, a
        lossy forward) computes its micro-batches with them.

        Returns:
            :attr:`losses`, which the step fills as its micro-batches run.
        """
        self._fns = fns
        self.losses.clear()
        return self.losses

    def gradients(self, step: int, micro: Sequence[MicroBatch]) -> list[Contribution]:
        """One flat vector per micro-batch: the gradient of the user's loss, then the
        floating buffers as that micro-batch left them (each starts from the same ones)."""
        if self._fns is None:
            raise RuntimeError("no loss function: the host calls begin_step before a step")
        loss_fn = self._fns.loss_fn
        params = list(self._params.values())
        base = {n: b.clone() for n, b in self._float_bufs.items()}
        ints = {n: b.clone() for n, b in self._int_bufs.items()}
        out = []
        try:
            for mb in micro:
                batch = to_device(self.fetch(mb.rows), self.device)
                # The same dropout masks whichever rank computes it (a rollback redoes it).
                with torch.random.fork_rng(devices=self._rng_devices):
                    torch.manual_seed(micro_seed(self.run_seed, step, mb.index))
                    loss = loss_fn(batch)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise UserError("the loss function must return a scalar tensor")
                value = float(loss.detach())
                if not math.isfinite(value) and not self._scalers:
                    # Under a GradScaler an overflow is routine: the scaler skips the step.
                    raise UserError(f"rank {self.rank_id}: the loss is {value} at step {step} "
                                    f"(micro-batch {mb.index}): training diverged")
                grads = torch.autograd.grad(loss, [p for p in params if p.requires_grad],
                                            allow_unused=True)
                it = iter(grads)
                flat = [(next(it) if p.requires_grad else None) for p in params]
                parts = [(g if g is not None else torch.zeros_like(p)).reshape(-1)
                         for g, p in zip(flat, params)]
                parts += [b.detach().reshape(-1) for b in self._float_bufs.values()]
                out.append((mb.index, torch.cat(parts).detach().to(torch.float32).clone()))
                # What the user's loss was: scaler.scale(loss) multiplied it by the scale.
                self.losses.append(value / self._scalers[0].get_scale() if self._scalers
                                   else value)
                self._set(self._float_bufs, base)
        finally:
            self._set(self._float_bufs, base)
            self._set(self._int_bufs, ints)
        return out

    def apply(self, flat: torch.Tensor, lr_scale: float = 1.0) -> None:
        """Apply a fully reduced vector: the buffers as they are, the gradient through
        the user's optimizer (:attr:`StepFns.update` if given, else ``opt.step()``),
        the learning rate times ``lr_scale`` for this step.

        Raises:
            UserError: the gradient is not finite and no GradScaler is registered to
                skip the step (one line: the rank, the step, how many values).
        """
        if not self._scalers and not bool(torch.isfinite(flat).all()):
            bad = int((~torch.isfinite(flat)).sum())
            raise UserError(f"rank {self.rank_id}: the averaged gradient of step {self.steps} "
                            f"holds {bad} non-finite values (inf or NaN): training diverged")
        update = self._fns.update if self._fns is not None else None
        if self._scalers and update is None:
            raise UserError("a GradScaler is registered: give your step to loop.step(loss_fn, "
                            "update=...), which calls scaler.step(optimizer) and "
                            "scaler.update()")
        flat = flat.to(self.device)
        at = 0
        for p in self._params.values():
            n = p.numel()
            p.grad = flat[at:at + n].view_as(p).to(p.dtype).clone() if p.requires_grad else None
            at += n
        with torch.no_grad():
            for b in self._float_bufs.values():
                n = b.numel()
                b.copy_(flat[at:at + n].view_as(b))
                at += n
            for b in self._int_bufs.values():
                b.add_(1)  # counters (num_batches_tracked) advance once per step
        saved = [g["lr"] for g in self.opt.param_groups]
        for g in self.opt.param_groups:
            g["lr"] = g["lr"] * lr_scale
        try:
            if update is None:
                self.opt.step()
            else:  # the same draws on every rank, whatever the update samples
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(micro_seed(self.run_seed, self.steps, -1))
                    update()
        finally:
            for g, lr in zip(self.opt.param_groups, saved):
                # A scheduler stepped inside the update set a new rate from the scaled
                # one (chainable schedulers): unscale it; an untouched rate goes back.
                g["lr"] = lr if g["lr"] == lr * lr_scale else g["lr"] / lr_scale
            self.opt.zero_grad(set_to_none=True)
        self.steps += 1

    @staticmethod
    def _set(bufs: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, b in bufs.items():
                b.copy_(values[n])

    # -- state ------------------------------------------------------------------
    @property
    def params(self) -> Tensors:
        """Copies of the parameters by name (what is evaluated and compared)."""
        return {n: p.detach().clone() for n, p in self._params.items()}

    def state(self) -> Tensors:
        """Copies of the model's parameters and buffers, the optimizer state and its
        numeric hyperparameters, and the step count, as flat string keys."""
        out = {f"params/{n}": p.detach().clone() for n, p in self._params.items()}
        out.update({f"buffers/{n}": b.detach().clone()
                    for n, b in self.model.named_buffers()})
        sd = self.opt.state_dict()
        for i, entry in sd["state"].items():
            for k, v in entry.items():
                if isinstance(v, torch.Tensor):
                    out[f"optim/state/{i}/{k}"] = v.detach().clone()
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[f"optim/state/{i}/{k}{_NUM}"] = torch.tensor(float(v),
                                                                     dtype=torch.float64)
        for gi, group in enumerate(sd["param_groups"]):
            for k, v in group.items():
                num = _numbers(v)
                if k != "params" and num is not None:
                    out[f"optim/group/{gi}/{k}"] = num
        out["meta/steps"] = torch.tensor([self.steps], dtype=torch.int64)
        out.update(self.hooks.state())
        for name, obj in self.registered.items():
            out.update(user_state.encode(name, obj))
        return out

    def state_like(self) -> Tensors | None:
        """None: a torch optimizer creates its state at its first step, so a fresh
        replica's keys are not a checkpoint's (:meth:`load` checks what it needs)."""
        return None

    def load(self, tensors: Tensors) -> None:
        """Take the state :meth:`state` produced on any replica of the same model.

        Raises:
            KeyError: a parameter or buffer is missing.
        """
        with torch.no_grad():
            for n, p in self._params.items():
                p.copy_(tensors[f"params/{n}"])
            for n, b in self.model.named_buffers():
                b.copy_(tensors[f"buffers/{n}"])
        sd = self.opt.state_dict()
        state: dict[int, dict[str, Any]] = {}
        for key, v in tensors.items():
            if key.startswith("optim/state/"):
                i, k = key[len("optim/state/"):].split("/", 1)
                if k.endswith(_NUM):
                    state.setdefault(int(i), {})[k[:-len(_NUM)]] = float(v)
                else:
                    state.setdefault(int(i), {})[k] = v.clone()
        for gi, group in enumerate(sd["param_groups"]):
            for k, v in list(group.items()):
                t = tensors.get(f"optim/group/{gi}/{k}")
                if t is not None:
                    group[k] = _restore(v, t)
        sd["state"] = state
        self.opt.load_state_dict(sd)
        steps = tensors.get("meta/steps")
        self.steps = int(steps[0]) if steps is not None else 0
        self.hooks.load(tensors)
        user_state.load(self.registered, tensors)

    @property
    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state().values())


def _numbers(v: object) -> torch.Tensor | None:
    """A hyperparameter as a tensor if it is a number or a tuple of numbers."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return torch.tensor(v, dtype=torch.int64)
    if isinstance(v, float):
        return torch.tensor(v, dtype=torch.float64)
    if isinstance(v, tuple) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                          for x in v):
        return torch.tensor([float(x) for x in v], dtype=torch.float64)
    return None


def _restore(like: object, t: torch.Tensor) -> object:
    """The hyperparameter ``t`` carries, in the type of the local value ``like``."""
    if isinstance(like, tuple):
        return tuple(float(x) for x in t.tolist())
    if isinstance(like, int) and not isinstance(like, bool):
        return int(t)
    return float(t)
