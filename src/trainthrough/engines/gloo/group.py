"""One incarnation of a gloo process group, and the collectives a step needs.

Call order: :meth:`Group.form` (rendezvous on a fresh store prefix), then any number
of :meth:`Group.reduce_bucket` / :meth:`Group.vote` / :meth:`Group.broadcast`, then
:meth:`Group.close`. Every collective that fails raises :class:`GroupError`; the
group is then unusable and must be closed and formed again without the failed
rank. Closing at once matters: destroying the group closes its sockets, so peers
still blocked in a collective with this rank (not connected to the dead one) get
"connection closed" within milliseconds instead of waiting for the timeout.

Each incarnation rendezvouses on its own prefix ``attempt{n}`` of the controller's
store: keys left by an earlier incarnation (its dead members' included) never mix
with the new one's, which is what torchrun needed to reconnect (ENVIRONMENT.md).
"""

from __future__ import annotations

import contextlib
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


class GroupError(Exception):
    """A collective failed (a peer died or hung) at ``phase`` after ``buckets_done``.

    Carries only plain fields, so it pickles if it ever crosses a process.
    """

    def __init__(self, phase: str, buckets_done: int, applied: bool, message: str) -> None:
        super().__init__(f"{phase}: {message}")
        self.phase, self.buckets_done, self.applied = phase, buckets_done, applied
        self.message = message
        self.t = time.time()


class Group:
    """The live members of attempt ``n``; this process is ``members.index(slot)``."""

    def __init__(self, store: dist.Store, n: int, members: list[int], slot: int,
                 timeout: float) -> None:
        self.store, self.n, self.members, self.slot = store, n, list(members), slot
        self.rank = self.members.index(slot)
        self.size = len(self.members)
        self.timeout = timeout
        self.formed = False

    def form(self) -> None:
        """Rendezvous and check the group with one small collective.

        Raises:
            GroupError: a member never arrived (within the timeout) or died meanwhile.
        """
        # Bind gloo to loopback: the default picks the interface of the host name.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        try:
            dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{self.n}", self.store),
                                    rank=self.rank, world_size=self.size,
                                    timeout=timedelta(seconds=self.timeout))
            self.formed = True
            dist.all_reduce(torch.zeros(1))
        except (RuntimeError, ValueError) as e:  # DistBackendError/DistStoreError are RuntimeErrors
            self.close()
            raise GroupError("boundary", 0, False, f"forming group {self.n}: {e}") from None

    def reduce_bucket(self, part: torch.Tensor, phase: str, done: int) -> torch.Tensor:
        """Sum ``part`` over the group, into a copy (the caller's local sum stays intact,
        since a failed ring leaves its buffer half reduced)."""
        out = part.clone()
        self._run(lambda: dist.all_reduce(out), phase, done, False)
        return out

    def vote(self, value: float, applied: bool) -> float:
        """Commit vote: succeeds only if every member reached the end of the step.

        ``value`` (the first member's control counter, 0 elsewhere) comes back summed,
        so every member learns it at the same step.
        """
        t = torch.tensor([value], dtype=torch.float64)
        self._run(lambda: dist.all_reduce(t), "update", 0, applied)
        return float(t[0])

    def broadcast(self, tensors: list[torch.Tensor], src: int = 0) -> None:
        """Overwrite ``tensors`` in place with those of member ``src``."""
        for x in tensors:
            self._run(lambda x=x: dist.broadcast(x, src=src), "boundary", 0, False)

    def _run(self, op: object, phase: str, done: int, applied: bool) -> None:
        try:
            op()  # type: ignore[operator]
        except RuntimeError as e:
            self.close()
            raise GroupError(phase, done, applied, str(e).splitlines()[0][:300]) from None

    def close(self) -> None:
        """Destroy the group (idempotent; errors from a broken group are expected)."""
        if self.formed or dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self.formed = False
