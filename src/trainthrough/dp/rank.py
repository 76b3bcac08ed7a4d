"""One data-parallel rank: a full replica of the parameters and of the optimizer state.

Every rank computes gradients on its share of the global mini-batch, takes part in
the allreduce and applies the averaged gradient with the same optimizer as a
parameter-server shard (:mod:`trainthrough.ps.optim`), so replicas stay identical as
long as they apply the same steps. Call order per step: :meth:`Rank.gradients`,
then the allreduce (outside the rank), then :meth:`Rank.apply`. Around failures:
:meth:`Rank.state` / :meth:`Rank.load` (checkpoints, a snapshot to undo a step) and
:meth:`Rank.joining` (a replacement copies a live rank). A rank knows nothing of
processes or clocks, so the sim and the gloo engines share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from trainthrough.dp.allreduce import Contribution, FlatLayout
from trainthrough.dp.batching import MicroBatch
from trainthrough.ps import optim
from trainthrough.workloads.base import OptimizerSpec, Params, Workload

Tensors = dict[str, torch.Tensor]


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
    def gradients(self, step: int, micro: Sequence[MicroBatch]) -> list[Contribution]: ...
    def apply(self, flat: torch.Tensor, lr_scale: float = 1.0) -> None: ...
    def state(self) -> Tensors: ...
    def state_like(self) -> Tensors | None: ...
    def load(self, tensors: Tensors) -> None: ...
    @property
    def state_bytes(self) -> int: ...


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
        self.steps = 0  # optimizer steps this replica applied
        self.label = workload.name
        self.device = torch.device("cpu")  # trainthrough's workloads compute on the CPU

    # -- training ---------------------------------------------------------------
    def gradients(self, step: int, micro: Sequence[MicroBatch]) -> list[Contribution]:
        """This rank's contributions at logical ``step``: one flat gradient per micro-batch."""
        out = []
        for mb in micro:
            g = self.workload.compute_update_on(self.params, mb.rows,
                                                micro_seed(self.run_seed, step, mb.index))
            out.append((mb.index, self.layout.flatten(g)))
        return out

    def apply(self, flat: torch.Tensor, lr_scale: float = 1.0) -> None:
        """Apply a fully reduced gradient (``lr_scale`` multiplies the learning rate)."""
        optim.apply(self.spec, self.params, self.layout.unflatten(flat), self.opt, lr_scale)
        self.steps += 1

    # -- state ------------------------------------------------------------------
    def state(self) -> Tensors:
        """Copies of everything a replica holds, as ``params/<name>`` and ``optim/<key>``.

        Flat string keys of plain tensors: checkpoints save it as safetensors, and a
        joining rank receives it over the network, never as a pickle.
        """
        out = {f"params/{n}": v.clone() for n, v in self.params.items()}
        out.update({f"optim/{k}": v.clone() for k, v in self.opt.items()})
        out["meta/steps"] = torch.tensor([self.steps], dtype=torch.int64)
        return out

    def state_like(self) -> Tensors | None:
        """What every state of this run holds (keys, dtypes, shapes): a checkpoint with
        anything else is corrupt."""
        return self.state()

    def load(self, tensors: Tensors) -> None:
        """Replace this replica's parameters and optimizer state with ``tensors``.

        Raises:
            KeyError: a parameter or optimizer entry is missing.
        """
        self.params = {n: tensors[f"params/{n}"].clone() for n in self.params}
        self.opt = {k: tensors[f"optim/{k}"].clone() for k in self.opt}
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
        r.load(donor.state())
        return r
