"""One incarnation of a gloo process group: the gloo :class:`~trainthrough.dp.collective.Collective`.

Call order: :meth:`Group.form` (rendezvous on a fresh store prefix), then the
collectives of the shared step and repair routines (:meth:`Group.allreduce`,
:meth:`Group.start` and :meth:`Group.wait`, :meth:`Group.commit`,
:meth:`Group.broadcast`, in the order the protocol states), then
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

The backend is the run's :class:`~trainthrough.dp.devices.CollectiveChoice`: gloo
reduces host tensors (a CUDA replica's bucket is staged through host memory), NCCL
device tensors (host tensors, such as the state-sharing flags, are staged onto the
device). A gloo collective fails by itself when a peer dies (its sockets close) or at
the group's timeout; an NCCL kernel waits for a dead peer forever, so an NCCL
collective is waited for here, up to the same timeout, and the communicator aborted
when it expires: every survivor then raises the same :class:`PeerLost` as on gloo.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any, Protocol

import torch
import torch.distributed as dist

from trainthrough.dp.allreduce import Bucket, Contribution
from trainthrough.dp.collective import PeerLost

# NCCL's own watchdog gets this much longer than the project's timeout: it must never
# act first (it would end the process instead of letting the group re-form).
NCCL_WATCHDOG_GRACE = 60.0


class Work(Protocol):
    """What an asynchronous collective returns (``dist.Work``)."""

    def is_completed(self) -> bool: ...
    def wait(self) -> Any: ...


class Group:
    """The live members of attempt ``n``; this process is ``members.index(slot)``.

    Its collectives block (never suspend), so the step may :meth:`start` a bucket from
    inside the backward (:attr:`overlaps`): the reduction runs on the backend's own
    threads while the backward goes on, as DDP's bucket hooks do.
    """

    overlaps = True

    def __init__(self, store: dist.Store, n: int, members: list[int], slot: int,
                 timeout: float, backend: str = "gloo",
                 device: torch.device | None = None) -> None:
        self.store, self.n, self.members, self.slot = store, n, list(members), slot
        self.rank = self.members.index(slot)
        self.size = len(self.members)
        self.timeout = timeout
        self.backend = backend
        # Where the backend reduces: host memory (gloo) or the replica's GPU (NCCL).
        self.wire = device if backend == "nccl" and device is not None else torch.device("cpu")
        self.formed = False
        self.broadcast_bytes = 0  # what :meth:`broadcast` moved (a joiner's state transfer)
        #: how long the collective that broke the group waited (its report says it: the
        #: full timeout means a member never came, timing.timed_out)
        self.waited = 0.0

    def form(self) -> None:
        """Rendezvous and check the group with one small collective.

        Raises:
            PeerLost: a member never arrived (within the timeout) or died meanwhile.
        """
        # The interface was chosen by rank_main (net.py); without one, gloo would pick
        # the interface of the host name: loopback then.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        timeout = self.timeout
        if self.backend == "nccl":
            torch.cuda.set_device(self.wire)
            # The project aborts a stalled communicator itself (:meth:`_wait`).
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
            timeout += NCCL_WATCHDOG_GRACE
        start = time.monotonic()
        try:
            dist.init_process_group(self.backend,
                                    store=dist.PrefixStore(f"attempt{self.n}", self.store),
                                    rank=self.rank, world_size=self.size,
                                    timeout=timedelta(seconds=timeout))
            self.formed = True
            probe = torch.zeros(1, device=self.wire)
            self._wait(dist.all_reduce(probe, async_op=True))
        except (RuntimeError, ValueError, TimeoutError) as e:
            # DistBackendError/DistStoreError are RuntimeErrors
            message = f"forming group {self.n}: {e}"
        else:
            return
        self.waited = time.monotonic() - start
        self.close()  # outside the handler, as in _run
        raise PeerLost(message)

    async def allreduce(self, parts: Sequence[Contribution], bucket: Bucket) -> torch.Tensor:
        """Sum this rank's ``parts`` (in the order given), then the ranks' sums.

        The result is a new tensor: the caller's gradients stay intact, since a failed
        ring leaves its buffer half reduced.
        """
        out = _local_sum(parts, bucket, extra=0)
        return self._reduce(out)

    async def start(self, parts: Sequence[Contribution], bucket: Bucket) -> _Started:
        """Begin the sum of ``bucket`` over the group: this rank's ``parts`` are summed
        into a new tensor now (the caller may change them as soon as this returns)."""
        out = _local_sum(parts, bucket, extra=0)
        wire = out if out.device == self.wire else out.to(self.wire)
        began = time.monotonic()
        try:
            work = dist.all_reduce(wire, async_op=True)
        except RuntimeError as e:
            message = str(e).splitlines()[0][:300]
        else:
            return _Started(out, wire, work, began)
        self.close()  # outside the handler, as in _run
        raise PeerLost(message)

    async def wait(self, handle: _Started) -> torch.Tensor:
        """The sum :meth:`start` began, on the parts' device."""
        # Timed from its start: how long it waited says whether it timed out (a straggler).
        self._run(lambda: handle.work, began=handle.began)
        wire = handle.wire
        return wire if wire is handle.out else wire.to(handle.out.device)

    async def commit(self, parts: Sequence[Contribution], bucket: Bucket,
                     ballot: float) -> tuple[torch.Tensor, float]:
        """The last bucket's allreduce with the commit vote as one more element.

        ``ballot`` (the first member's control counter, 0 elsewhere) comes back summed,
        so every member learns it at the same step. A float32 element holds counters
        exactly up to 2**24, far more requests than a run makes.
        """
        out = _local_sum(parts, bucket, extra=1)
        out[-1] = ballot
        out = self._reduce(out)
        return out[:-1], float(out[-1])

    async def broadcast(self, tensors: list[torch.Tensor], src: int = 0) -> None:
        """Overwrite ``tensors`` in place with those of member ``src``."""
        self.broadcast_bytes += sum(x.numel() * x.element_size() for x in tensors)
        for x in tensors:
            wire = x if x.device == self.wire else x.to(self.wire)
            self._run(partial(dist.broadcast, wire, src=src, async_op=True))
            if wire is not x:
                x.copy_(wire)

    def _reduce(self, out: torch.Tensor) -> torch.Tensor:
        """The sum over the group of ``out``, on ``out``'s device, reduced on the wire's."""
        wire = out if out.device == self.wire else out.to(self.wire)
        self._run(lambda: dist.all_reduce(wire, async_op=True))
        return wire if wire is out else wire.to(out.device)

    def _wait(self, work: Work | None) -> None:
        """Wait for ``work``; on NCCL at most the timeout, then abort the communicator.

        Raises:
            TimeoutError: the NCCL collective did not complete in time.
        """
        if work is None:
            return
        if self.backend == "nccl":
            wait_or_abort(work, self.timeout, _abort_nccl)
        work.wait()

    def _run(self, op: Callable[[], Work | None], began: float | None = None) -> None:
        start = time.monotonic() if began is None else began
        try:
            self._wait(op())
            return
        except (RuntimeError, TimeoutError) as e:
            message = str(e).splitlines()[0][:300]
        self.waited = time.monotonic() - start
        # Raised outside the handler: an exception raised inside keeps the gloo error as
        # its context, whose traceback holds torch's frames and with them the process
        # group, whose sockets then stay open after close(): the peers that were not
        # connected to the dead rank would then wait for the full collective timeout
        # instead of failing within milliseconds.
        self.close()
        raise PeerLost(message)

    def pace(self, seconds: float) -> None:
        """From now on a collective of this group fails after ``seconds`` (the straggler
        deadline, for a step's collectives; the group formed under the collective
        timeout, which a rendezvous and a state transfer keep)."""
        if self.formed and self.backend == "gloo":
            from torch.distributed import distributed_c10d

            distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))
        self.timeout = seconds

    def close(self) -> None:
        """Destroy the group (idempotent; errors from a broken group are expected)."""
        if self.formed or dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self.formed = False


class _Started:
    """A bucket :meth:`Group.start` began: its local sum and where it is reduced."""

    def __init__(self, out: torch.Tensor, wire: torch.Tensor, work: Work | None,
                 began: float) -> None:
        self.out, self.wire, self.work, self.began = out, wire, work, began


def wait_or_abort(work: Work, timeout: float, abort: Callable[[], None],
                  poll: float = 0.0005) -> None:
    """Return once ``work`` completed; after ``timeout`` seconds call ``abort`` and raise.

    Raises:
        TimeoutError: naming the timeout (the group is then unusable).
    """
    deadline = time.monotonic() + timeout
    while not work.is_completed():
        if time.monotonic() >= deadline:
            abort()
            raise TimeoutError(f"collective timed out after {timeout:g} s: a peer is lost "
                               "or hung (NCCL communicator aborted)")
        time.sleep(poll)


def _abort_nccl() -> None:
    """Abort every NCCL communicator of this process, so its kernels stop waiting."""
    from torch.distributed import distributed_c10d

    abort = getattr(distributed_c10d, "_abort_process_group", None)
    with contextlib.suppress(Exception):
        if abort is not None:
            abort()


def _local_sum(parts: Sequence[Contribution], bucket: Bucket, extra: int) -> torch.Tensor:
    """This rank's ``parts`` summed over ``bucket`` in the order given, in a new tensor
    (on the parts' device) with ``extra`` zero elements after it (the commit vote's).
    The first part is copied, the others added (one pass over a bucket of one part,
    as the simulated collective sums)."""
    device = parts[0][1].device if parts else torch.device("cpu")
    out = torch.empty(bucket.numel + extra, device=device)
    out[bucket.numel:] = 0.0
    if not parts:
        out[:bucket.numel] = 0.0
    for i, (_, g) in enumerate(parts):
        if i == 0:
            out[:bucket.numel].copy_(g[bucket.start:bucket.stop])
        else:
            out[:bucket.numel].add_(g[bucket.start:bucket.stop])
    return out
