"""Pipelined chain replication for one shard replica: order, forwarding, acknowledgement.

Every push a replica applies gets a *chain position* (1, 2, ...), assigned by the head
and carried down the chain. The head forwards as it applies, without waiting for the
previous forwards to reach the tail: up to ``IN_FLIGHT`` forward calls are outstanding
on each link, and what is applied meanwhile goes in the next call (a send costs
more CPU than applying a push, and the CPU is what a replicated chain runs out of);
an asynchronous link also lingers for a fuller group.

How a forward travels (:mod:`~trainthrough.engines.ray.chain.forward`): over one TCP
connection per link, a non-pickle frame (:mod:`~trainthrough.engines.ray.chain.link_socket`),
not a Ray actor call (link_socket says why). Who sends: on an asynchronous link
the link's sender thread, and its collector thread takes the replies; on a synchronous
one a thread that waits for the tail anyway (a push, or in the middle the forward's own
thread) sends the group and takes the reply itself (see :meth:`ChainLink._await_durable`).

What a forward carries (group commit). Either the pushes applied since the last
forward, at positions ``first``, ``first + 1``, ... (the successor applies them), or
the replica's whole *state* at position ``pos`` (parameters, optimizer state, version,
dedup table: the successor takes it, which holds every push up to ``pos``), whichever
is fewer bytes: a forward's cost grows with its bytes, and a replica that takes a state
applies nothing. A successor applies pushes in position order (a threaded Ray
actor may start calls in any order, so a forward that arrives early waits for its
turn); a state at a position it already has is only acknowledged.

Acknowledgement. ``durable`` is the highest position the rest of the chain has
(the successor acknowledged it; for the tail, what it applied). A synchronous push is
acknowledged to its sender only once ``durable`` covers it, so an acknowledged push is
on every live replica; an asynchronous one at once (at most ``max_lag`` ahead).

Failures. When a forward fails, the link is *broken*: waiting synchronous pushes
raise (their senders retry the same sequence number, which the shard's dedup absorbs).
Once the chain is rewired (successor died: :meth:`ChainLink.rewire`, called by the
driver) or after a short pause (successor alive, its own successor broke), the next
forward is the whole state: it holds every position the successor may have missed, so
no log of unacknowledged pushes is kept. Positions only grow down a chain (a replica
has at most its predecessor's), so the state a predecessor sends never takes a
successor back. A replica that starts taking pushes from workers leads a new
*generation*: forwards still in flight from the head it replaced are refused, so two
heads never hand out the same position. A replica promoted because its head was lost
leads its generation from the promotion (:meth:`ChainLink.lead`), before any worker
knows it: a head that was only cut off and comes back finds its forwards refused, and
(synchronous) can acknowledge nothing more.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from trainthrough.engines.ray.chain import wire
from trainthrough.engines.ray.chain.forward import Forward, Forwarder, Pending, SuccessorDied

Item = wire.Item
Tensors = dict[str, torch.Tensor]
# A forward waits this long for the positions before it (its sender died otherwise).
REORDER_SECONDS = 5.0
# A synchronous push waits this long for the tail (a dead replica is rewired in ms).
ACK_SECONDS = 30.0
RETRY_PAUSE = 0.01
# Forward calls outstanding per link. Measured (CPU seconds of each actor process per
# update, cnn, 2 cores): the CPU, not the wait, is what a chain runs out of, and a Ray
# call costs each side 0.5-1 ms of CPU, 5-10 times a push's apply. With 2 in flight
# nearly every push went alone; with 1, what is applied during a call's round trip
# goes together in the next.
IN_FLIGHT = 1
# An asynchronous link also waits for a fuller group: at most ASYNC_LINGER seconds for
# ASYNC_BATCH pushes (or ``max_lag``, if smaller: the head would block first). Nobody
# waits on an asynchronous forward, so it costs lag, not throughput.
ASYNC_BATCH = 16
ASYNC_LINGER = 0.1
# A synchronous push's sender waits for the tail, and each worker has one push
# outstanding, so a group is what arrived during the last call: 1.56 pushes on average
# (cnn, 4 workers, 2 cores), each group two Ray calls down the chain. The head waits
# at most SYNC_LINGER seconds for one push from every worker it has seen (then it sends
# at once): 1.8 pushes a group at 3 ms, 2.25 at 10 ms. The wait costs the push's
# latency, not CPU: meanwhile the other workers compute.
SYNC_LINGER = 0.003


class ChainBroken(RuntimeError):
    """The push is applied here but not yet known to be on the whole chain: retry it."""


class Replica:
    """What a link needs of the shard it replicates; every call runs under the link's
    lock. Default: nothing to apply or copy (a subclass or the actor provides them)."""

    def apply(self, worker: int, seq: int, update: Any, scale: float) -> bool:
        """Apply a push unless a duplicate; True if applied."""
        return True

    def state(self) -> Tensors:
        """The live state (parameters, optimizer state, version, dedup table)."""
        return {}

    def load(self, state: Tensors) -> None:
        """Take ``state`` as a whole (copying it)."""


class ChainLink:
    """This replica's place in its chain. Every method runs under ``cond`` (the actor's
    lock) except the two threads of a replica with a successor: :meth:`_send_loop`,
    which sends, and :meth:`_complete`, which collects acknowledgements. Pushes and
    forwards wait on ``cond`` (for their turn, their acknowledgement, room to lag)."""

    def __init__(self, cond: threading.Condition, replica: Replica, max_lag: int) -> None:
        self.cond, self.replica, self.max_lag = cond, replica, max_lag
        # The sender and the collector wait on conditions of their own over the same
        # lock: a notification wakes only the threads it concerns. One condition for
        # all woke every waiting push, the sender and the collector on every change
        # (a thread switch each, where the CPU is what a chain runs out of).
        self._send_cv = threading.Condition(cond)  # type: ignore[arg-type]
        self._ack_cv = threading.Condition(cond)  # type: ignore[arg-type]
        self._drive_cv = threading.Condition(cond)  # type: ignore[arg-type]
        self.successor: Any = None
        self.forwarder = Forwarder()
        self.mode = "none"
        self.forwarded = 0
        self.sent_states = 0  # forwards that carried the state (the rest carried pushes)
        self.reset(0, 0)
        self._completer: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self._lingering = False  # the sender waits for a fuller group (a timed wait)
        # Synchronous links: threads waiting for the tail, and whether one of them is
        # the driver (sends the next group itself: see ``_await_durable``).
        self._waiters = 0
        self._driving = False
        self._driver_lingering = False
        self._closed = False

    def reset(self, gen: int, pos: int) -> None:
        """Take a chain place copied from another replica (or a fresh one)."""
        self.gen, self.pos, self.durable = gen, pos, pos
        self.head = False
        self._workers: set[int] = set()
        self._out: list[Item] = []  # applied since the last forward, not yet sent
        self._out_bytes = 0
        self._out_since = 0.0  # when the oldest of ``_out`` was applied
        # The next forward must be the state: pushes since the last forward would not
        # continue what the successor has (a state taken, a rewire, a break).
        self._whole = True
        self._state_bytes = -1  # the replica's state size, once known (see ``_take``)
        self._calls = 0  # forward calls outstanding in this link epoch
        # Forwards on their way: last position, pending reply, link epoch.
        self._sent: deque[tuple[int, Pending, int]] = deque()
        # Only ever grows (a reset keeps counting): an outcome of a send from before a
        # reset can never pass for a current one.
        self._epoch = getattr(self, "_epoch", 0) + 1
        self._broken = False

    @property
    def lag(self) -> int:
        return self.pos - self.durable

    # -- pushes -------------------------------------------------------------------
    def from_worker(self, item: Item) -> None:
        """A worker's push: applied unless a duplicate, forwarded, acknowledged (sync:
        once on the tail; a duplicate once everything applied before it is)."""
        self.lead()  # the first head of a chain leads from its first push
        self._workers.add(item.worker)
        if self.mode == "async":
            self._wait(lambda: self.lag < self.max_lag or self._broken, ACK_SECONDS)
        with self._sync_waiter() as sync:
            if self.replica.apply(*item):
                self._advance(item)
            if sync:
                self._await_durable(self.pos)

    def lead(self) -> None:
        """Lead a new generation, if this replica does not lead one yet: from now on
        forwards of the head it replaced are refused. The driver calls it on the
        replica it promotes, before any worker is told of it: a head cut off (a
        partition, its ZooKeeper session expired) may live on and forward again once
        the network heals, and must find its successor already gone ahead, not in
        the same generation until some worker's push happens to reach it first."""
        if not self.head:
            self.head, self.gen = True, self.gen + 1
            self.cond.notify_all()  # forwards waiting from the replaced head give up

    def from_predecessor(self, gen: int, first: int, items: list[Item]) -> None:
        """Forwarded pushes at chain positions ``first``, ``first + 1``, ... of
        generation ``gen``: applied in order (positions already here are skipped)."""
        self._check_gen(gen)
        if first > self.pos + 1:  # an earlier call is still on its way: its turn first
            if not self._wait(lambda: self.pos >= first - 1 or self.gen != gen,
                              REORDER_SECONDS):
                raise ChainBroken(f"position {first} came without the ones before it")
            if self.gen != gen:
                raise ChainBroken("the head was replaced")
        with self._sync_waiter() as sync:
            for k, item in enumerate(items):
                if first + k == self.pos + 1:
                    self.replica.apply(*item)
                    self._advance(item)
            self.cond.notify_all()
            if sync:
                self._await_durable(first + len(items) - 1)

    def from_state(self, gen: int, pos: int, state: Tensors) -> None:
        """The predecessor's whole state at position ``pos``: taken if ahead of this
        replica (it holds every push up to ``pos``), else only acknowledged."""
        self._check_gen(gen)
        with self._sync_waiter() as sync:
            if pos > self.pos:
                self.replica.load(state)
                self.pos = pos
                if self.successor is None:
                    self.durable = pos
                else:  # pushes gathered before it are in it; the successor needs the state
                    self._out, self._out_bytes, self._whole = [], 0, True
                    self._flush()
            self.cond.notify_all()
            if sync:
                self._await_durable(pos)

    def _check_gen(self, gen: int) -> None:
        if gen < self.gen:
            raise ChainBroken(f"forward from a replaced head (generation {gen} < {self.gen})")
        self.gen = gen

    def _advance(self, item: Item) -> None:
        self.pos += 1
        if self.successor is None:
            self.durable = self.pos  # the tail: applied here is on the whole chain
            return
        if self._whole:
            self._flush()  # the state goes next, and holds this push
            return
        if not self._out:
            self._out_since = time.monotonic()
        self._out.append(item)
        self._out_bytes += wire.nbytes(item)
        self._flush()

    def _ready(self) -> bool:
        return (bool(self._out) or self._whole) and self.successor is not None \
            and self._calls < IN_FLIGHT and not self._broken

    def _flush(self) -> None:
        """Wake the sender if it has something to do now. A sender lingering for a
        fuller group wakes on its own when the linger is over: waking it for every push
        cost a thread switch each. Synchronous, with threads waiting for the tail: one
        of them sends (the thread whose push this is claims it next), so only a
        lingering driver is woken, once its group is full."""
        if not self._ready():
            return
        if self.mode == "sync" and self._waiters:
            if self._driver_lingering and self._linger() <= 0:
                self._drive_cv.notify()
            return
        if not self._lingering or self._linger() <= 0:
            self._send_cv.notify()

    def _send_loop(self) -> None:
        """Send in position order, one thread, without the shard's lock: a send costs
        more CPU than applying an update (a Ray call's much more), and a push (or pull)
        waiting behind it would pay for it. Only the state's copy is taken under the
        lock, so it matches ``pos``."""
        while True:
            with self.cond:
                while not self._closed:
                    if not self._ready() or self._driving or \
                            (self.mode == "sync" and self._waiters):
                        self._send_cv.wait()
                        continue
                    linger = self._linger()
                    if linger <= 0:
                        break
                    self._lingering = True
                    self._send_cv.wait(linger)
                    self._lingering = False
                if self._closed:
                    return
                job = self._take()
            pending = self.forwarder.send(*job)
            with self.cond:
                # A rewire meanwhile sends the state again: this call's outcome is moot.
                if job.epoch == self._epoch:
                    self._sent.append((job.last, pending, job.epoch))
                    self._ack_cv.notify()

    def _take(self) -> Forward:
        """What the next forward carries (under the lock): the pushes, or the state
        (copied here, under the lock, so it matches the last position)."""
        last = self.pos
        first = last - len(self._out) + 1
        state: Tensors | None = None
        if self._state_bytes < 0:
            self._state_bytes = wire.state_nbytes(self.replica.state())
        # The state's size as of the last state built: it changes only with the dedup
        # table (16 bytes a worker), and building the state dict for every group to
        # size it cost ~40 us a forward.
        if self._whole or self._out_bytes >= self._state_bytes:
            live = self.replica.state()  # live views; built once (it makes small tensors)
            self._state_bytes = wire.state_nbytes(live)
            state = {k: v.clone() for k, v in live.items()}
            self.sent_states += 1
        items = self._out
        self._out, self._out_bytes, self._whole = [], 0, False
        self._calls += 1
        return Forward(self.successor, self._epoch, self.gen, first, last, items, state)

    def _linger(self) -> float:
        """Seconds the sender still waits for more pushes before sending (0: now)."""
        if self._whole:
            return 0.0
        if self.mode == "sync":
            if not self.head or len(self._out) >= len(self._workers):
                return 0.0
            return SYNC_LINGER - (time.monotonic() - self._out_since)
        if len(self._out) >= min(ASYNC_BATCH, self.max_lag):
            return 0.0
        return ASYNC_LINGER - (time.monotonic() - self._out_since)

    @contextlib.contextmanager
    def _sync_waiter(self) -> Iterator[bool]:
        """Around a synchronous push or forward, from before it is applied: the thread
        counts as waiting for the tail (it will drive its own group), so applying it
        does not wake the sender thread, which would find a waiter and sleep again (a
        thread switch per push, where the CPU is what a chain runs out of). Only code
        that does not block runs between this and :meth:`_await_durable` (a waiter
        that blocks elsewhere would drive nothing). Yields whether the link is sync."""
        if self.mode != "sync":
            yield False
            return
        self._waiters += 1
        try:
            yield True
        finally:
            self._waiters -= 1
            if not self._waiters:
                self._flush()  # work left with no waiter to drive it: the sender's

    def _await_durable(self, pos: int) -> None:
        """Wait until the tail has ``pos`` (synchronous links). Meanwhile one waiting
        thread at a time is the *driver*: it sends the next group itself and collects
        the reply, instead of handing the group to the sender thread and the reply to
        the collector (two thread switches per group per replica, where the CPU is
        what a chain runs out of). In the middle of a chain that thread is the one that
        received the forward: it applies, forwards, waits and replies, alone. The
        caller is a waiter already (:meth:`_sync_waiter`)."""
        deadline = time.monotonic() + ACK_SECONDS
        while self.durable < pos and not self._broken:
            if not self._driving and self._ready():
                if not self._drive(deadline):
                    break
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChainBroken(f"position {pos} not acknowledged by the tail in time")
            self.cond.wait(left)
        if self.durable < pos:
            raise ChainBroken(f"the chain broke before position {pos} reached the tail")

    def _drive(self, deadline: float) -> bool:
        """As the driver: linger for a fuller group, or send it and wait for the reply
        with the lock released (the caller holds it exactly once: the actor's
        ``with lock``). Another waiter drives the group after this one.

        Returns:
            False if the forward failed: the link is broken (and, the successor alive,
            already set to send its state again), and this push raises, as every
            waiting one does.
        """
        self._driving = True
        try:
            linger = min(self._linger(), deadline - time.monotonic())
            if linger > 0:
                self._driver_lingering = True
                self._drive_cv.wait(linger)
                self._driver_lingering = False
                return True
            job = self._take()
            self.cond.release()
            try:
                error = self._transmit(job)
            finally:
                self.cond.acquire()
            failed = error is not None and job.epoch == self._epoch  # else moot: sent again
            retry = self._settle(job.last, job.epoch, error)
        finally:
            self._driving = False
        if retry:
            self._pause_and_reconnect(job.epoch)
        return not failed

    def _transmit(self, job: Forward) -> Exception | None:
        """Send one forward and wait for its reply (without the lock)."""
        try:
            self.forwarder.send(*job).result()
        except Exception as e:  # noqa: BLE001 - every failure breaks the link
            return e
        return None

    def _wait(self, done: Callable[[], bool], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.cond.wait(left)
        return True

    # -- the chain changes ----------------------------------------------------------
    def rewire(self, successor: Any, mode: str) -> None:
        """A new successor (None: this replica is the tail now); the next forward is
        the state, which holds whatever the successor may lack."""
        self.successor, self.mode = successor, mode
        self._reconnect()
        if successor is not None and self._completer is None:
            self._completer = threading.Thread(target=self._complete, daemon=True,
                                               name="chain-acks")
            self._completer.start()
            self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                            name="chain-send")
            self._sender.start()

    def close(self) -> bool:
        """The run is over: stop sending and collecting (nothing more is promised).
        Returns whether both threads ended (an actor whose did not is not reused)."""
        with self.cond:
            self._closed, self.successor = True, None
            self._out, self._sent = [], deque()
            for c in (self.cond, self._send_cv, self._ack_cv, self._drive_cv):
                c.notify_all()
        self.forwarder.drop()
        for t in (self._sender, self._completer):
            if t is not None:
                t.join(timeout=5)
        return not any(t is not None and t.is_alive() for t in (self._sender, self._completer))

    def _reconnect(self) -> None:
        self._epoch += 1
        self.forwarder.drop()  # a new connection for the new epoch
        self._broken = False
        self._sent.clear()  # outcomes of earlier sends no longer decide anything
        self._calls = 0
        self._out, self._out_bytes, self._whole = [], 0, True
        if self.successor is None:
            self.durable = self.pos
        else:
            # Sent even if ``durable`` covers ``pos`` (one call per rewire): an
            # asynchronous successor acknowledges before its own successor has a push,
            # so a new successor may lack positions this replica counts as durable.
            self._flush()
        self.cond.notify_all()

    def _complete(self) -> None:
        """Collect acknowledgements in send order; a failure breaks the link."""
        while True:
            with self.cond:
                while not self._sent and not self._closed:
                    self._ack_cv.wait()
                if self._closed:
                    return
                pos, pending, epoch = self._sent.popleft()
            error: Exception | None = None
            try:
                pending.result()
            except Exception as e:  # noqa: BLE001 - every failure breaks the link
                error = e
            with self.cond:
                if self._settle(pos, epoch, error):
                    self._pause_and_reconnect(epoch)

    def _settle(self, pos: int, epoch: int, error: Exception | None) -> bool:
        """A forward's outcome (under the lock); True: pause and send the state again
        (the successor is alive; its own successor broke, or the connection failed)."""
        if epoch == self._epoch:
            self._calls -= 1
        if error is None:
            self.forwarded += 1
            advanced = pos > self.durable
            if advanced:  # an acknowledgement covers all before it
                self.durable = pos
            if advanced or (self.mode == "sync" and self._waiters and self._ready()):
                self.cond.notify_all()  # and a waiter drives what was applied meanwhile
            if epoch == self._epoch:
                self._flush()  # what was applied meanwhile, as one call
            return False
        if epoch != self._epoch:
            return False  # sent before a rewire: already sent again
        self._broken = True
        self.cond.notify_all()
        # The successor died: the driver rewires (rewire sends again).
        return not isinstance(error, SuccessorDied)

    def _pause_and_reconnect(self, epoch: int) -> None:
        """Alive successor, failed forward: try again shortly (under the lock, held
        once; released while pausing)."""
        self.cond.release()
        try:
            time.sleep(RETRY_PAUSE)
        finally:
            self.cond.acquire()
        if self._broken and epoch == self._epoch:
            self._reconnect()
