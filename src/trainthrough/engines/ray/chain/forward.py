"""How one chain link sends its forwards: over its socket, or a Ray call.

A forward goes over the link's own connection (:mod:`link_socket`) whenever its
tensors are of a dtype a frame carries, which is every workload here; anything else
goes as a Ray actor call (``chain_push`` / ``chain_state``), pickled by Ray as before.
Either way the chain link gets a :class:`Pending` whose :meth:`Pending.result`
returns once the successor has the forward, and raises:

* :class:`SuccessorDied` when Ray reports the successor's process dead: the driver
  rewires the chain, nothing to retry;
* anything else when the successor is alive but refused (its own successor broke) or
  the connection failed: the link pauses and resends its state.

The connection is opened by the sender thread on the first forward of a link epoch
(the successor's address comes from one Ray call, ``chain_address``, cached per
successor), and closed when the link changes (:meth:`Forwarder.drop`).
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import ray
import torch

from trainthrough.engines.ray.chain import wire
from trainthrough.engines.ray.chain.link_socket import Address, Channel

# How long a forward's reply may take: the successor may wait ``REORDER_SECONDS`` for
# a position and ``ACK_SECONDS`` for its own successor (chain_link), and more.
REPLY_SECONDS = 60.0
# How long the successor's address may take to come (one Ray call to a live actor).
ADDRESS_SECONDS = 10.0


class Forward(NamedTuple):
    """One forward to a successor, as its chain link takes it (under the link's lock);
    its fields are :meth:`Forwarder.send`'s arguments, in order."""

    successor: Any  #: the successor's actor handle
    epoch: int  #: the link epoch it was taken in (a rewire starts a new one)
    gen: int  #: the generation of the head that ordered its pushes
    first: int  #: the chain position of the first push
    last: int  #: the chain position of the last push, or of the state
    items: list[wire.Item]  #: the pushes at ``first``..``last`` (unsent if ``state``)
    state: dict[str, torch.Tensor] | None  #: the whole state at ``last``, or None


class SuccessorDied(RuntimeError):
    """Ray reported the successor's process dead: wait for the driver's rewire."""


class Pending:
    """A forward on its way; :meth:`result` waits for the successor's reply."""

    def __init__(self, wait: Any = None, error: Exception | None = None) -> None:
        self._wait, self._error = wait, error

    def result(self) -> None:
        if self._error is not None:
            raise self._error
        try:
            self._wait()
        except ray.exceptions.RayActorError as e:
            raise SuccessorDied(str(e)) from e


class Forwarder:
    """One link's way to its successor (used by the link's sender thread; ``drop``
    from any thread)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._chan: Channel | None = None
        self._chan_epoch = -1
        self._addresses: dict[int, tuple[Any, Address]] = {}  # id(handle) -> (handle, address)
        self.socket_sends = 0  # forwards that went over the socket (the rest by Ray call)

    def send(self, succ: Any, epoch: int, gen: int, first: int, last: int,
             items: list[wire.Item], state: dict[str, torch.Tensor] | None) -> Pending:
        """Send pushes at positions ``first``..``last`` (``state`` None) or ``state`` at
        ``last`` (a :class:`Forward`, unpacked); never raises (a failure is the returned
        Pending's)."""
        header, tensors = (wire.frame_items(gen, first, items) if state is None
                           else wire.frame_state(gen, last, state))
        if not wire.framable(tensors):
            return self._by_ray(succ, gen, first, last, items, state)
        try:
            chan = self._channel(succ, epoch)
            head, buffers = wire.describe(header, tensors)
            chan.send(head, buffers)
        except ray.exceptions.RayActorError as e:
            return Pending(error=SuccessorDied(str(e)))
        except Exception as e:  # noqa: BLE001 - any failure is the link's to retry
            self.drop()
            return Pending(error=e)
        self.socket_sends += 1
        return Pending(chan.reply)

    def _by_ray(self, succ: Any, gen: int, first: int, last: int, items: list[wire.Item],
                state: dict[str, torch.Tensor] | None) -> Pending:
        # Only tensors a frame cannot carry come here, pickled by Ray as they are.
        ref = (succ.chain_state.remote(gen, last, state) if state is not None
               else succ.chain_push.remote(gen, first, items))
        return Pending(lambda: ray.get(ref))

    def _channel(self, succ: Any, epoch: int) -> Channel:
        with self._guard:
            if self._chan is not None and self._chan_epoch == epoch:
                return self._chan
        known, address = self._addresses.get(id(succ), (None, None))
        if known is not succ or address is None:
            address = ray.get(succ.chain_address.remote(), timeout=ADDRESS_SECONDS)
            self._addresses = {id(succ): (succ, address)}  # only the current successor
        chan = Channel(address, REPLY_SECONDS)
        with self._guard:
            old, self._chan, self._chan_epoch = self._chan, chan, epoch
        if old is not None:
            old.close()
        return chan

    def drop(self) -> None:
        """Close the connection (a rewire, a break, the end): a thread waiting for a
        reply on it gets an error, which the link's epoch makes moot."""
        with self._guard:
            chan, self._chan, self._chan_epoch = self._chan, None, -1
        if chan is not None:
            chan.close()
