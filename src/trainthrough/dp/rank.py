"""One data-parallel rank: a full replica of the parameters and of the optimizer state.

Every rank computes gradients on its share of the global mini-batch, takes part in
the allreduce and applies the averaged gradient with the same optimizer as a
parameter-server shard (:mod:`trainthrough.ps.optim`), so replicas stay identical as
long as they apply the same steps. Call order per step: :meth:`Rank.new_grads`,
:meth:`Rank.gradients` into them, then the allreduce (outside the rank), then
:meth:`Rank.apply`. Around failures:
:meth:`Rank.state` / :meth:`Rank.load` (checkpoints, a snapshot to undo a step) and
:meth:`Rank.joining` (a replacement copies a live rank). A rank knows nothing of
processes or clocks, so the sim and the gloo engines share it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from trainthrough.dp.allreduce import FlatLayout, Grads
from trainthrough.dp.batching import MicroBatch
from trainthrough.ps import optim
from trainthrough.workloads.base import OptimizerSpec, Params, Workload

Tensors = dict[str, torch.Tensor]
#: ``ready(start, stop)``: elements ``[start, stop)`` of the flat gradient hold this
#: rank's whole share of the step (called during the backward of its last micro-batch).
Ready = Callable[[int, int], None]


class Numel(Protocol):
    @property
    def numel(self) -> int: ...


class Replica(Protocol):
    """What the step, repair and checkpoint routines need of a replica: a
    :class:`Rank` (a trainthrough workload) or a
    :class:`~trainthrough.dp.module_replica.ModuleReplica` (a user's own module)."""

    rank_id: int
    steps: int
    label: str  # what checkpoints record as the model's name
    device: torch.device  # where it computes; its state and gradients live there

    @property
    def layout(self) -> Numel: ...
    @property
    def params(self) -> Tensors: ...
    def new_grads(self, separate: bool) -> Grads:
        """An empty accumulator for one step's gradients, on the replica's device:
        kept per micro-batch (``separate``) or summed into one flat vector."""
        ...
    def gradients(self, step: int, micro: Sequence[MicroBatch], into: Grads,
                  ready: Ready | None = None) -> None:
        """Add the gradients of ``micro`` at logical ``step`` to ``into``; ``ready`` is
        told, during the last micro-batch, which elements are whole (the replica may
        tell it nothing: the step then starts every bucket after the call)."""
        ...
    def apply(self, flat: torch.Tensor, lr_scale: float = 1.0) -> None: ...
    def state(self, copy: bool = True) -> Tensors:
        """Everything the replica holds, by flat string keys: copies, or (``copy``
        False) the live tensors where it has them, to read before it changes again."""
        ...
    def state_like(self) -> Tensors | None: ...
    def load(self, tensors: Tensors, own: bool = False) -> None:
        """Take a state :meth:`state` produced; ``own``: the tensors are given away
        (kept as they are, not copied)."""
        ...
    @property
    def state_bytes(self) -> int: ...


def live_params(replica: Replica) -> Tensors:
    """The replica's parameters by name as they are (no copies): to read before it
    changes again (a hash, a norm)."""
    return {k[len("params/"):]: v for k, v in replica.state(copy=False).items()
            if k.startswith("params/")}


def micro_seed(run_seed: int, step: int, micro: int) -> int:
    """Sampling seed of a micro-batch: independent of the rank that computes it, so a
    micro-batch redone by another rank (rollback) draws the same dropout masks."""
    return (run_seed * 1_000_003 + step * 104_729 + micro * 7_919 + 1) % (2**63 - 1)


class Rank:
    """A replica: ``params`` and ``opt`` (the optimizer state), plus who it is."""

    def __init__(self, rank_id: int, workload: Workload, spec: OptimizerSpec,
                 params: Params, run_seed: int) -> None:
        self.rank_id = rank_id
        self.workload = workload
        self.spec = spec
        self.run_seed = run_seed
        self.params: Params = {n: v.detach().clone() for n, v in params.items()}
        self.opt: Tensors = optim.init_state(spec, self.params)
        self.layout = FlatLayout(self.params)
        self._flat: torch.Tensor | None = None  # new_grads' summed vector, allocated once
        self.steps = 0  # optimizer steps this replica applied
        self.label = workload.name
        self.device = torch.device("cpu")  # trainthrough's workloads compute on the CPU

    # -- training ---------------------------------------------------------------
    def new_grads(self, separate: bool) -> Grads:
        """Per micro-batch, or summed into a flat vector kept from step to step (a new
        one each step would cost its page faults every step)."""
        if separate:
            return Grads(self.layout.numel, separate=True)
        if self._flat is None:
            self._flat = torch.zeros(self.layout.numel)
        return Grads(self.layout.numel, separate=False, flat=self._flat, fresh=True)

    def gradients(self, step: int, micro: Sequence[MicroBatch], into: Grads,
                  ready: Ready | None = None) -> None:
        """This rank's gradients at logical ``step``, one micro-batch after the other
        (the workload computes whole gradients: nothing to overlap, ``ready`` unused)."""
        for mb in micro:
            g = self.workload.compute_update_on(self.params, mb.rows,
                                                micro_seed(self.run_seed, step, mb.index))
            if into.flat is None:
                into.add(mb.index, self.layout.flatten(g))
                continue
            into.settle()
            for name, part in self.layout.unflatten(into.flat).items():
                if name in g:  # a parameter missing from g contributes zeros
                    part.add_(g[name])
            into.mark(mb.index)

    def apply(self, flat: torch.Tensor, lr_scale: float = 1.0) -> None:
        """Apply a fully reduced gradient (``lr_scale`` multiplies the learning rate)."""
        optim.apply(self.spec, self.params, self.layout.unflatten(flat), self.opt, lr_scale)
        self.steps += 1

    # -- state ------------------------------------------------------------------
    def state(self, copy: bool = True) -> Tensors:
        """Everything a replica holds, as ``params/<name>`` and ``optim/<key>``: copies,
        or the live tensors (``copy`` False).

        Flat string keys of plain tensors: checkpoints save it as safetensors, and a
        joining rank receives it over the network, never as a pickle.
        """
        out = {f"params/{n}": v.clone() if copy else v for n, v in self.params.items()}
        out.update({f"optim/{k}": v.clone() if copy else v for k, v in self.opt.items()})
        out["meta/steps"] = torch.tensor([self.steps], dtype=torch.int64)
        return out

    def state_like(self) -> Tensors | None:
        """What every state of this run holds (keys, dtypes, shapes): a checkpoint with
        anything else is corrupt."""
        return self.state()

    def load(self, tensors: Tensors, own: bool = False) -> None:
        """Replace this replica's parameters and optimizer state with ``tensors``
        (copies of them, unless ``own``: the caller gives them away).

        Raises:
            KeyError: a parameter or optimizer entry is missing.
        """
        def take(t: torch.Tensor) -> torch.Tensor:
            return t if own else t.clone()

        self.params = {n: take(tensors[f"params/{n}"]) for n in self.params}
        self.opt = {k: take(tensors[f"optim/{k}"]) for k in self.opt}
        steps = tensors.get("meta/steps")
        self.steps = int(steps[0]) if steps is not None else 0

    @property
    def state_bytes(self) -> int:
        """Bytes of parameters plus optimizer state (what a copy or a snapshot moves)."""
        return sum(t.numel() * t.element_size()
                   for t in (*self.params.values(), *self.opt.values()))

    @classmethod
    def joining(cls, rank_id: int, donor: Rank) -> Rank:
        """A replacement rank that starts from a copy of a live rank's state."""
        r = cls(rank_id, donor.workload, donor.spec, donor.params, donor.run_seed)
        r.load(donor.state(), own=True)
        return r
