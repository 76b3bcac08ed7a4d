"""Relaxed synchronization: LocalSGD and DiLoCo (streaming too), written once for every host.

Each replica takes inner steps alone, on its share of the global batch, with its own
optimizer (the workload's, or the user's: the *inner* optimizer); every ``H`` inner
steps the group makes one *outer* step, the only collective:

- ``localsgd``: the replicas' parameters are averaged;
- ``diloco``: the pseudo-gradient ``global - local`` (``global``: the parameters of the
  last outer step) is averaged and applied to ``global`` by an outer optimizer,
  SGD with Nesterov momentum by default (Douillard et al., DiLoCo, 2023); every
  replica then starts its next inner steps from the new ``global``.

Streaming DiLoCo cuts the flat parameter vector into ``F`` fragments, each with its own
outer step on a staggered schedule (fragment ``f`` after inner steps ``t`` with
``t mod H = (f+1) H / F mod H``), so one outer step moves ``1/F`` of the parameters.

A step as one replica sees it (each ``inj.at`` an injection point, as in
:mod:`trainthrough.dp.step`): ``boundary``; its gradients; ``inner``; its local update
(no collective: a lost peer goes unnoticed here). Then, if an outer step is due:
``outer``; one :meth:`~trainthrough.dp.collective.Collective.commit` of the fragment,
which carries every member's vote of one, so the members learn how many averaged;
the outer update, the same on every member.

Recovery follows from where the collective is: a replica lost during inner steps
takes only its own local progress since its last outer step along (at most ``H``
steps); the survivors, who find out at the outer collective, re-form and run the
outer step without it; an outer step interrupted before its collective completed
was applied by nobody and is run again on the survivors. A replacement joins at an
outer boundary and receives the global parameters *and* the outer optimizer's
momentum: they are part of :meth:`RelaxedReplica.state`, so the shared state
transfer (:func:`~trainthrough.dp.repair.share_state`) and checkpoints carry them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trainthrough.config import RunConfig
from trainthrough.dp.allreduce import Bucket, FlatLayout, Grads, make_buckets
from trainthrough.dp.batching import MicroBatch
from trainthrough.dp.collective import Collective, Injector, PeerLost
from trainthrough.dp.rank import Numel, Ready, Replica, Tensors
from trainthrough.dp.step import InFlight, StepSpec

# The injection points of a relaxed step, in order.
POINTS = ("boundary", "inner", "outer")
METHODS = ("localsgd", "diloco")


@dataclass(frozen=True)
class SyncSpec:
    """How often and how a relaxed group synchronizes (fixed for a run).

    ``every``: H, inner steps between two outer steps of a fragment; ``fragments``: F
    (1: the whole model at once; more: streaming DiLoCo); ``outer_lr``,
    ``outer_momentum``, ``nesterov``: the outer optimizer (``diloco`` only).
    """

    method: str
    every: int
    fragments: int = 1
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown relaxed-sync method {self.method!r}")
        if self.every < 1 or not 1 <= self.fragments <= self.every:
            raise ValueError(f"need 1 <= fragments ({self.fragments}) <= H ({self.every})")

    def offset(self, fragment: int) -> int:
        """Inner steps (mod H) after which ``fragment`` has its outer step."""
        return self.every * (fragment + 1) // self.fragments % self.every

    def due(self, inner_steps: int) -> list[int]:
        """Fragments whose outer step follows the group's ``inner_steps``-th inner step."""
        if inner_steps <= 0:
            return []
        return [f for f in range(self.fragments)
                if inner_steps % self.every == self.offset(f)]

    def buckets(self, numel: int) -> tuple[Bucket, ...]:
        """The fragments as contiguous slices of the flat parameter vector."""
        return make_buckets(numel, self.fragments)

    @classmethod
    def of(cls, cfg: RunConfig, sync: str) -> SyncSpec | None:
        """The run's relaxed sync for a strategy's ``sync`` (None: ``every-step``)."""
        if sync == "every-step":
            return None
        return cls("localsgd" if sync == "localsgd" else "diloco", cfg.sync_every,
                   cfg.sync_fragments if sync == "streaming-diloco" else 1,
                   cfg.outer_lr, cfg.outer_momentum)


class RelaxedReplica:
    """A replica (:class:`~trainthrough.dp.rank.Replica`) plus the outer state.

    Delegates training to the wrapped replica; holds ``global_`` (the flat parameters
    of the last outer step, per fragment) and ``momentum`` (the outer optimizer's
    buffer), identical on every member after each outer step. Its :meth:`state` holds
    the wrapped replica's state plus ``outer/global`` and ``outer/momentum``.
    """

    def __init__(self, inner: Replica, sync: SyncSpec) -> None:
        self.inner, self.sync = inner, sync
        self.flat = FlatLayout(inner.params)
        self.global_ = self.flat.flatten(inner.params)
        self.momentum = torch.zeros_like(self.global_)
        self.fragments = sync.buckets(self.flat.numel)
        self.since_sync = 0  # inner steps applied since this replica's last outer step
        self._synced: Tensors | None = None  # synced_params(), until the next outer step

    # -- the Replica protocol, delegated ------------------------------------------
    # A user's loop hands its loss and update to its ModuleReplica itself (begin_step),
    # never through this wrapper: only the protocol's names are delegated.
    @property
    def rank_id(self) -> int:
        return self.inner.rank_id

    @rank_id.setter
    def rank_id(self, value: int) -> None:
        self.inner.rank_id = value

    @property
    def steps(self) -> int:
        return self.inner.steps

    @steps.setter
    def steps(self, value: int) -> None:
        self.inner.steps = value

    @property
    def label(self) -> str:
        return self.inner.label

    @label.setter
    def label(self, value: str) -> None:
        self.inner.label = value

    @property
    def device(self) -> torch.device:
        return self.inner.device

    @device.setter
    def device(self, value: torch.device) -> None:
        self.inner.device = value

    @property
    def layout(self) -> Numel:
        return self.inner.layout

    @property
    def params(self) -> Tensors:
        return self.inner.params

    def new_grads(self, separate: bool) -> Grads:
        return self.inner.new_grads(separate)

    def gradients(self, step: int, micro: Sequence[MicroBatch], into: Grads,
                  ready: Ready | None = None) -> None:
        self.inner.gradients(step, micro, into, ready)

    def apply(self, flat: torch.Tensor, lr_scale: float = 1.0) -> None:
        self.inner.apply(flat, lr_scale)
        self.since_sync += 1

    def state(self, copy: bool = True) -> Tensors:
        out = self.inner.state(copy)
        out["outer/global"] = self.global_.clone() if copy else self.global_
        out["outer/momentum"] = self.momentum.clone() if copy else self.momentum
        return out

    def state_like(self) -> Tensors | None:
        like = self.inner.state_like()
        if like is None:
            return None
        like.update({"outer/global": self.global_.clone(), "outer/momentum": self.momentum.clone()})
        return like

    def load(self, tensors: Tensors, own: bool = False) -> None:
        """Load a replica's state; the outer state too when it holds one (a checkpoint
        or a peer's state), else the outer step restarts from the loaded parameters."""
        self.inner.load(tensors, own)
        g, m = tensors.get("outer/global"), tensors.get("outer/momentum")
        # Onto the replica's device (a checkpoint or a peer's bytes arrive in host memory).
        device = self.inner.device
        self.global_ = (g.to(device, copy=not own) if g is not None
                        else self.flat.flatten(self.inner.params))
        self.momentum = (m.to(device, copy=not own) if m is not None
                         else torch.zeros_like(self.global_))
        self.since_sync = 0
        self._synced = None

    @property
    def state_bytes(self) -> int:
        return self.inner.state_bytes + 2 * self.global_.numel() * self.global_.element_size()

    # -- the outer step -------------------------------------------------------------
    def synced_params(self) -> Tensors:
        """The parameters of the last outer step (what the group agrees on); the same
        tensors until the next outer step or load (callers must not modify them)."""
        if self._synced is None:
            self._synced = {n: v.clone() for n, v in self.flat.unflatten(self.global_).items()}
        return self._synced

    def outer_part(self) -> torch.Tensor:
        """What this replica contributes to an outer step (whole length; the fragment's
        elements are used): its parameters (localsgd) or its pseudo-gradient (diloco)."""
        local = self.flat.flatten(self.inner.params)
        return local if self.sync.method == "localsgd" else self.global_ - local

    def outer_apply(self, frag: Bucket, mean: torch.Tensor) -> None:
        """Apply the members' ``mean`` contribution to fragment ``frag`` and start from it."""
        s = slice(frag.start, frag.stop)
        self._synced = None
        if self.sync.method == "localsgd":
            self.global_[s] = mean
        else:
            m = self.momentum[s]
            m.mul_(self.sync.outer_momentum).add_(mean)
            step = mean + self.sync.outer_momentum * m if self.sync.nesterov else m
            self.global_[s] -= self.sync.outer_lr * step
        local = self.flat.flatten(self.inner.params)
        local[s] = self.global_[s]
        state = self.inner.state(copy=False)  # all but the parameters as they are
        state.update({f"params/{n}": v for n, v in self.flat.unflatten(local).items()})
        steps = self.inner.steps
        self.inner.load(state, own=True)
        self.inner.steps = steps
        if frag.index == len(self.fragments) - 1:
            self.since_sync = 0


def local_gradient(grads: Grads, spec: StepSpec, micro_count: int) -> torch.Tensor:
    """This replica's gradient of an inner step: the mean over its micro-batches; a
    ``sum`` workload's sum scaled to the whole global batch (what one step of the
    synchronous group would apply). A summed ``grads`` is scaled in place."""
    n = len(grads.indices)
    total = (grads.flat if grads.flat is not None else
             torch.stack([g for _, g in sorted(grads.parts, key=lambda c: c[0])]).sum(0))
    return total.div_(n) if spec.mean else total.mul_(micro_count / n)


async def inner_step(rank: RelaxedReplica, fl: InFlight, inj: Injector, spec: StepSpec,
                     step: int) -> None:
    """One inner step of ``rank`` on its share of ``fl.batch``: no collective.

    Args:
        step: attempts executed before this one (what failure triggers count).
    """
    await inj.at("boundary", step)
    mine = fl.batch.share.get(rank.rank_id, [])
    fl.phase = "inner"
    rank.gradients(fl.logical, mine, fl.grads)
    await inj.at("inner", step)
    if fl.grads.indices:
        rank.apply(local_gradient(fl.grads, spec, fl.batch.micro_count), fl.batch.lr_scale)
    fl.committed = True


async def outer_step(rank: RelaxedReplica, coll: Collective, inj: Injector, fragment: int,
                     step: int, ballot: Callable[[], float] = lambda: 0.0) -> float:
    """The outer step of ``fragment`` on the group ``coll``: every member makes it.

    One collective: the fragment's sum of every member's :meth:`~RelaxedReplica.outer_part`,
    with each member's vote of one (plus ``ballot()``, the host's control value) in the
    same message. Nobody applies anything before it completed, so an interrupted
    outer step is simply run again on the survivors.

    Returns:
        The vote's sum minus the members (the sum of the ballots).

    Raises:
        PeerLost: located at ``outer`` (nothing applied).
    """
    await inj.at("outer", step)
    frag = rank.fragments[fragment]
    try:
        total, tally = await coll.commit([(rank.rank_id, rank.outer_part())], frag,
                                         1.0 + ballot())
    except PeerLost as e:
        raise e.located("outer", 0) from None
    members = len(coll.members)
    rank.outer_apply(frag, total / members)
    return tally - members
