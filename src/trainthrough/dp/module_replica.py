"""A user's own ``nn.Module`` and optimizer as a data-parallel replica.

The step routine (:mod:`trainthrough.dp.step`) works on a replica that adds its
micro-batches' gradients into one flat vector, applies a reduced one and saves or loads its state
(:class:`~trainthrough.dp.rank.Rank` does it for a :class:`~trainthrough.workloads.base.Workload`).
:class:`ModuleReplica` does the same for a model, an optimizer and a loss function
that stay the user's: the gradient is the backward of their loss, accumulated into
``.grad`` views of the flat vector the allreduce carries (as DDP's buckets), the update
is their optimizer's ``step()``, so every recovery, checkpoint and injection point of
the project applies to their loop unchanged.

Model buffers (BatchNorm's running statistics) are synchronized, not refused: each
micro-batch runs from the buffers of the last committed step, the floating buffers it
leaves behind travel in the allreduce with the gradient, and every rank sets them to
their mean over the global batch (the running statistics of one update with the mean
batch statistics; integer counters advance by one per step). So replicas stay
identical, and a rollback or a joining rank finds the buffers of the committed step.

State travels as flat tensors (``params/``, ``buffers/``, ``optim/state/<i>/<key>``,
``optim/group/<g>/<key>``, ``meta/steps``; the user's registered objects under
``user/<name>/`` (:mod:`~trainthrough.dp.user_state`) and the callbacks' counts,
``meta/epochs_ended`` and ``meta/evals_done`` (:mod:`~trainthrough.dp.hooks`)):
safetensors on disk, tensors broadcast over the group to a joiner, never a pickle.

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
from trainthrough.dp.allreduce import Grads
from trainthrough.dp.batching import MicroBatch
from trainthrough.dp.devices import to_device
from trainthrough.dp.hooks import Hooks
from trainthrough.dp.rank import Ready, Tensors, micro_seed
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
    """The length of the flat vector the allreduce carries (buffers, then the gradient)."""

    numel: int


class ModuleReplica:
    """One rank's view of the user's model: gradients, updates and state as the step needs.

    Call order per step (as for :class:`~trainthrough.dp.rank.Rank`), after the host's
    :meth:`begin_step` with the user's :class:`StepFns`: :meth:`new_grads`,
    :meth:`gradients` into them, the allreduce outside, then :meth:`apply`;
    :attr:`losses` holds the step's losses. ``gradients`` leaves the parameters,
    buffers and optimizer as it found them (only ``.grad`` holds the local gradient),
    so a step that fails before its update needs no undo.
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
        self._viewed: set[int] = set()  # parameters whose .grad is a view of the flat vector
        self._fresh: set[int] = set()  # parameters whose elements hold nothing yet
        self._into: torch.Tensor | None = None  # the flat vector a backward adds to now
        self._ready: Ready | None = None  # told of what is whole (the last micro-batch)
        self._flat: torch.Tensor | None = None  # new_grads' vector, allocated once
        self._lay_out()
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

    def new_grads(self, separate: bool) -> Grads:
        """The step's accumulator: summed into this replica's own flat gradient (kept
        from step to step, as DDP keeps its buckets; the first micro-batch overwrites
        it), or per micro-batch."""
        if separate:
            return Grads(self.layout.numel, separate=True, device=self.device)
        if self._flat is None:
            self._flat = torch.empty(self.layout.numel, device=self.device)
        return Grads(self.layout.numel, separate=False, flat=self._flat, fresh=True)

    def gradients(self, step: int, micro: Sequence[MicroBatch], into: Grads,
                  ready: Ready | None = None) -> None:
        """Add the user's gradient of each micro-batch, then the floating buffers as that
        micro-batch left them (each starts from the same ones), to ``into``.

        The backward accumulates straight into the flat vector: every float32
        parameter's ``.grad`` is a view of it (DDP's ``gradient_as_bucket_view``), so
        no second copy of the gradient exists. Into a vector that holds nothing yet
        (``into.fresh``), the first micro-batch's gradients are copied in as their hook
        fires (no zeroing first, no addition to zeros); other dtypes are moved in by
        their hook. During the last micro-batch, ``ready`` hears of each parameter as
        its gradient is whole (its post-accumulate hook), in the backward's order.
        """
        if self._fns is None:
            raise RuntimeError("no loss function: the host calls begin_step before a step")
        if not micro:
            into.settle()
            return
        base = {n: b.clone() for n, b in self._float_bufs.items()}
        ints = {n: b.clone() for n, b in self._int_bufs.items()}
        try:
            for i, mb in enumerate(micro):
                fresh = into.flat is None or into.fresh
                flat = into.flat if into.flat is not None else torch.empty(
                    self.layout.numel, device=self.device)
                into.fresh = False  # from here on it holds (part of) a micro-batch's
                self._accumulate(step, mb, flat, fresh, ready if i == len(micro) - 1 else None)
                if into.flat is None:
                    into.add(mb.index, flat)
                else:
                    into.mark(mb.index)
                self._set(self._float_bufs, base)
        finally:
            self._into = self._ready = None
            self._set(self._float_bufs, base)
            self._set(self._int_bufs, ints)

    def _accumulate(self, step: int, mb: MicroBatch, flat: torch.Tensor, fresh: bool,
                    ready: Ready | None) -> None:
        """One micro-batch's forward and backward, its gradient added into ``flat``
        (``fresh``: written into it, whatever it held)."""
        assert self._fns is not None
        self._bind(flat, fresh=fresh)
        batch = to_device(self.fetch(mb.rows), self.device)
        # The same dropout masks whichever rank computes it (a rollback redoes it).
        with torch.random.fork_rng(devices=self._rng_devices):
            torch.manual_seed(micro_seed(self.run_seed, step, mb.index))
            loss = self._fns.loss_fn(batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise UserError("the loss function must return a scalar tensor")
        value = float(loss.detach())
        if not math.isfinite(value) and not self._scalers:
            # Under a GradScaler an overflow is routine: the scaler skips the step.
            raise UserError(f"rank {self.rank_id}: the loss is {value} at step {step} "
                            f"(micro-batch {mb.index}): training diverged")
        with torch.no_grad():  # the buffers as this forward left them (restored later:
            for b, (start, stop) in zip(self._float_bufs.values(), self._buf_regions):
                part = flat[start:stop]  # the backward may still read them)
                part.copy_(b.reshape(-1)) if fresh else part.add_(b.reshape(-1))
            if fresh:  # what is not trained has no gradient: zeros
                for start, stop in self._frozen_regions:
                    flat[start:stop] = 0.0
        self._into, self._ready = flat, ready
        if ready is not None:  # whole already: the buffers and what is not trained
            for start, stop in self._still:
                ready(start, stop)
        torch.autograd.backward(loss, inputs=self._trained)
        self._into = self._ready = None
        for p in self._trained:  # no gradient this time (unused): zeros
            if id(p) in self._fresh:
                start, stop = self._regions[id(p)]
                flat[start:stop] = 0.0
                self._view(p, flat)
        # What the user's loss was: scaler.scale(loss) multiplied it by the scale.
        self.losses.append(value / self._scalers[0].get_scale() if self._scalers else value)

    def _accumulated(self, p: torch.Tensor) -> None:
        """A parameter's post-accumulate hook: its gradient of this micro-batch is in.
        A gradient that is not a view of the flat vector is moved into it (copied if
        the vector held nothing of it yet, else added) and the view takes its place."""
        flat = self._into
        if flat is None:  # a backward of the user's own, outside a step
            return
        key = id(p)
        start, stop = self._regions[key]
        if key not in self._viewed and p.grad is not None:
            part, g = flat[start:stop], p.grad.detach().reshape(-1)
            part.copy_(g) if key in self._fresh else part.add_(g.to(flat.device, flat.dtype))
            self._view(p, flat)
        self._fresh.discard(key)
        if self._ready is not None:
            self._ready(start, stop)

    def _view(self, p: torch.Tensor, flat: torch.Tensor) -> None:
        """``p.grad`` becomes the view of its elements of ``flat`` (None for another
        dtype or device: its hook moves its gradient in)."""
        if p.dtype == flat.dtype and p.device == flat.device:
            start, stop = self._regions[id(p)]
            p.grad = flat[start:stop].view_as(p)
            self._viewed.add(id(p))
        else:
            p.grad = None

    def _bind(self, flat: torch.Tensor, fresh: bool = False, copy_others: bool = False) -> None:
        """Point every float32 parameter's ``.grad`` at its elements of ``flat``
        (``fresh``: at nothing yet, their hook copies the first gradient in); other
        dtypes get None, or (``copy_others``) a converted copy of their elements."""
        self._viewed.clear()
        self._fresh = {id(p) for p in self._trained} if fresh else set()
        for p, (start, stop) in zip(self._trained, self._trained_regions):
            if fresh:
                p.grad = None
            elif copy_others and not (p.dtype == flat.dtype and p.device == flat.device):
                p.grad = flat[start:stop].view_as(p).to(p.dtype).clone()
            else:
                self._view(p, flat)

    def apply(self, flat: torch.Tensor, lr_scale: float = 1.0) -> None:
        """Apply a fully reduced vector: the buffers as they are, the gradient through
        the user's optimizer (:attr:`StepFns.update` if given, else ``opt.step()``),
        the learning rate times ``lr_scale`` for this step. The parameters' ``.grad``
        are views of ``flat`` meanwhile (the update may change them in place).

        Raises:
            UserError: the gradient is not finite and no GradScaler is registered to
                skip the step (one line: the rank, the step, how many values).
        """
        # A finite sum means finite values (an inf or NaN anywhere makes it inf or NaN).
        if not self._scalers and not math.isfinite(float(flat.sum())):
            bad = int((~torch.isfinite(flat)).sum())
            if bad:
                raise UserError(f"rank {self.rank_id}: the averaged gradient of step "
                                f"{self.steps} holds {bad} non-finite values (inf or NaN): "
                                "training diverged")
        update = self._fns.update if self._fns is not None else None
        if self._scalers and update is None:
            raise UserError("a GradScaler is registered: give your step to loop.step(loss_fn, "
                            "update=...), which calls scaler.step(optimizer) and "
                            "scaler.update()")
        flat = flat.to(self.device)
        self._bind(flat, copy_others=True)
        with torch.no_grad():
            for b, (start, stop) in zip(self._float_bufs.values(), self._buf_regions):
                b.copy_(flat[start:stop].view_as(b))
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
            self._viewed.clear()
        self.steps += 1

    def _lay_out(self) -> None:
        """Where everything sits in the flat vector, in the order the backward finishes
        it (DDP's reverse parameter order): the floating buffers (whole after the
        forward), then the parameters last to first; the hooks that report them."""
        at, self._buf_regions = 0, []
        for b in self._float_bufs.values():
            self._buf_regions.append((at, at + b.numel()))
            at += b.numel()
        self._regions: dict[int, tuple[int, int]] = {}
        for p in reversed(list(self._params.values())):
            self._regions[id(p)] = (at, at + p.numel())
            at += p.numel()
        self.layout = Flat(at)
        self._trained = [p for p in self._params.values() if p.requires_grad]
        self._trained_regions = [self._regions[id(p)] for p in self._trained]
        # Whole before any backward: the buffers, and parameters that are not trained.
        self._frozen_regions = [self._regions[id(p)] for p in self._params.values()
                                if not p.requires_grad]
        self._still = self._buf_regions + self._frozen_regions
        self._hooks = [p.register_post_accumulate_grad_hook(self._accumulated)
                       for p in self._trained]

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

    def state(self, copy: bool = True) -> Tensors:
        """The model's parameters and buffers, the optimizer state and its numeric
        hyperparameters, and the step count, as flat string keys: copies, or the live
        tensors (``copy`` False; small ones are made anyway)."""
        def take(t: torch.Tensor) -> torch.Tensor:
            return t.detach().clone() if copy else t.detach()

        out = {f"params/{n}": take(p) for n, p in self._params.items()}
        out.update({f"buffers/{n}": take(b) for n, b in self.model.named_buffers()})
        sd = self.opt.state_dict()
        for i, entry in sd["state"].items():
            for k, v in entry.items():
                if isinstance(v, torch.Tensor):
                    out[f"optim/state/{i}/{k}"] = take(v)
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

    def load(self, tensors: Tensors, own: bool = False) -> None:
        """Take the state :meth:`state` produced on any replica of the same model
        (``own``: the optimizer keeps the tensors given, not copies).

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
                    state.setdefault(int(i), {})[k] = v if own else v.clone()
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
        return sum(t.numel() * t.element_size() for t in self.state(copy=False).values())


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
