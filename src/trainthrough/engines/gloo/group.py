"""One incarnation of a gloo process group: the gloo :class:`~trainthrough.dp.collective.Collective`.

Call order: :meth:`Group.form` (rendezvous on a fresh store prefix), then the
collectives of the shared step and repair routines (:meth:`Group.allreduce`,
:meth:`Group.commit`, :meth:`Group.broadcast`, in the order the protocol states), then
:meth:`Group.close`. They block (their coroutines never suspend: run them with
:func:`~trainthrough.dp.collective.run_blocking`). Every collective that fails raises
:class:`~trainthrough.dp.collective.PeerLost`; the group is then unusable and must
be closed and formed again without the failed rank. Closing at once matters:
destroying the group closes its sockets, so peers still blocked in a collective with
this rank (not connected to the dead one) get "connection closed" within milliseconds
instead of waiting for the timeout.

Each incarnation rendezvouses on its own prefix ``attempt{n}`` of the controller's
store: keys left by an earlier incarnation (its dead members' included) never mix
with the new one's (torchrun restarts need the same per-attempt prefix to reconnect).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist

from trainthrough.dp.allreduce import Bucket, Contribution
from trainthrough.dp.collective import PeerLost


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
            PeerLost: a member never arrived (within the timeout) or died meanwhile.
        """
        # The interface was chosen by rank_main (net.py); without one, gloo would pick
        # the interface of the host name: loopback then.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        try:
            dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{self.n}", self.store),
                                    rank=self.rank, world_size=self.size,
                                    timeout=timedelta(seconds=self.timeout))
            self.formed = True
            dist.all_reduce(torch.zeros(1))
        except (RuntimeError, ValueError) as e:  # DistBackendError/DistStoreError are RuntimeErrors
            message = f"forming group {self.n}: {e}"
        else:
            return
        self.close()  # outside the handler, as in _run
        raise PeerLost(message)

    async def allreduce(self, parts: Sequence[Contribution], bucket: Bucket) -> torch.Tensor:
        """Sum this rank's ``parts`` (in the order given), then the ranks' sums.

        The result is a new tensor: the caller's gradients stay intact, since a failed
        ring leaves its buffer half reduced.
        """
        out = _local_sum(parts, bucket, extra=0)
        self._run(lambda: dist.all_reduce(out))
        return out

    async def commit(self, parts: Sequence[Contribution], bucket: Bucket,
                     ballot: float) -> tuple[torch.Tensor, float]:
        """The last bucket's allreduce with the commit vote as one more element.

        ``ballot`` (the first member's control counter, 0 elsewhere) comes back summed,
        so every member learns it at the same step. A float32 element holds counters
        exactly up to 2**24, far more requests than a run makes.
        """
        out = _local_sum(parts, bucket, extra=1)
        out[-1] = ballot
        self._run(lambda: dist.all_reduce(out))
        return out[:-1], float(out[-1])

    async def broadcast(self, tensors: list[torch.Tensor], src: int = 0) -> None:
        """Overwrite ``tensors`` in place with those of member ``src``."""
        for x in tensors:
            self._run(partial(dist.broadcast, x, src=src))

    def _run(self, op: Callable[[], object]) -> None:
        try:
            op()
            return
        except RuntimeError as e:
            message = str(e).splitlines()[0][:300]
        # Raised outside the handler: an exception raised inside keeps the gloo error as
        # its context, whose traceback holds torch's frames and with them the process
        # group, whose sockets then stay open after close(): the peers that were not
        # connected to the dead rank would then wait for the full collective timeout
        # instead of failing within milliseconds.
        self.close()
        raise PeerLost(message)

    def close(self) -> None:
        """Destroy the group (idempotent; errors from a broken group are expected)."""
        if self.formed or dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self.formed = False


def _local_sum(parts: Sequence[Contribution], bucket: Bucket, extra: int) -> torch.Tensor:
    """This rank's ``parts`` summed over ``bucket`` in the order given, in a new tensor
    with ``extra`` zero elements after it (the commit vote's)."""
    out = torch.zeros(bucket.numel + extra)
    for _, g in parts:
        out[:bucket.numel].add_(g[bucket.start:bucket.stop])
    return out
