"""Pipelined chain replication for one shard replica: order, forwarding, acknowledgement.

Every push a replica applies gets a *chain position* (1, 2, ...), assigned by the head
and carried down the chain; every replica applies pushes in position order (a threaded
Ray actor may start calls in any order, so a forward that arrives early waits for its
turn). The head forwards pushes as they are applied, without waiting for the previous
ones to reach the tail: up to ``IN_FLIGHT`` forward calls are outstanding on each
link, and pushes applied meanwhile go together in the next call (a Ray call costs
more CPU than applying a push, and the CPU is what a replicated chain runs out of);
and an asynchronous link lingers for a fuller batch.
Order is kept by the positions, not by waiting.

Acknowledgement. ``durable`` is the highest position the rest of the chain has
(the successor acknowledged it; for the tail, what it applied). A synchronous push is
acknowledged to its sender only once ``durable`` covers it, so an acknowledged push is
on every live replica; an asynchronous one at once (at most ``max_lag`` ahead).

Failures. Pushes stay in this replica's log until acknowledged. When a forward fails,
the link is *broken*: waiting synchronous pushes raise (their senders retry the same
sequence number, which the shard's dedup absorbs), and the log is sent again in order
once the chain is rewired (successor died: :meth:`ChainLink.rewire`, called by the
driver) or after a short pause (successor alive, its own successor broke). A replica
that already has a position acknowledges it again without applying it. A replica that
starts taking pushes from workers leads a new *generation*: forwards still in flight
from the head it replaced are refused, so two heads never hand out the same position.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import ray

from trainthrough.engines.ray import wire

Item = wire.Item
Apply = Callable[[int, int, Any, float], bool]  # True: applied (not a duplicate)
# A forward waits this long for the positions before it (its sender died otherwise).
REORDER_SECONDS = 5.0
# A synchronous push waits this long for the tail (a dead replica is rewired in ms).
ACK_SECONDS = 30.0
RETRY_PAUSE = 0.01
# Forward calls outstanding per link. Measured (CPU seconds of each actor process per
# update, cnn, 2 cores): the CPU, not the wait, is what a chain runs out of, and a Ray
# call costs each side ~1 ms of CPU, 4-10 times a push's apply. With 2 in flight nearly every push went
# alone; with 1, the pushes applied during a call's round trip go together in the next.
IN_FLIGHT = 1
# An asynchronous link also waits for a fuller batch: at most ASYNC_LINGER seconds for
# ASYNC_BATCH pushes (or ``max_lag``, if smaller: the head would block first). Nobody
# waits on an asynchronous forward, so it costs lag, not throughput (at ~130 pushes/s,
# 20 ms gathered only 2-3). A synchronous push's sender waits for the tail, and each
# worker has one push outstanding: a batch there is what arrived during the last call.
ASYNC_BATCH = 16
ASYNC_LINGER = 0.1


class ChainBroken(RuntimeError):
    """The push is applied here but not yet known to be on the whole chain: retry it."""


class ChainLink:
    """This replica's place in its chain. Every method runs under ``cond`` (the actor's
    lock) except the two threads of a replica with a successor: :meth:`_send_loop`,
    which sends, and :meth:`_complete`, which collects acknowledgements."""

    def __init__(self, cond: threading.Condition, apply: Apply, max_lag: int) -> None:
        self.cond, self.apply, self.max_lag = cond, apply, max_lag
        self.successor: Any = None
        self.mode = "none"
        self.forwarded = 0
        self.reset(0, 0)
        self._completer: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self._closed = False

    def reset(self, gen: int, pos: int) -> None:
        """Take a chain place copied from another replica (or a fresh one)."""
        self.gen, self.pos, self.durable = gen, pos, pos
        self.head = False
        self._log: OrderedDict[int, Item] = OrderedDict()  # applied, not acknowledged
        self._out: list[tuple[int, Item]] = []  # applied, not yet sent
        self._out_since = 0.0  # when the oldest of ``_out`` was applied
        self._calls = 0  # forward calls outstanding in this link epoch
        self._sent: deque[tuple[int, Any, int]] = deque()  # last position, ref, link epoch
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
        if not self.head:  # first worker push: this replica leads the chain now
            self.head, self.gen = True, self.gen + 1
            self.cond.notify_all()  # forwards waiting from the replaced head give up
        if self.mode == "async":
            self._wait(lambda: self.lag < self.max_lag or self._broken, ACK_SECONDS)
        if self.apply(*item):
            self._append(item)
        if self.mode == "sync":
            self._await_durable(self.pos)

    def from_predecessor(self, gen: int, first: int, items: list[Item]) -> None:
        """Forwarded pushes at chain positions ``first``, ``first + 1``, ... of
        generation ``gen``: applied in order (positions already here are skipped)."""
        if gen < self.gen:
            raise ChainBroken(f"forward from a replaced head (generation {gen} < {self.gen})")
        self.gen = gen
        if first > self.pos + 1:  # an earlier call is still on its way: its turn first
            if not self._wait(lambda: self.pos >= first - 1 or self.gen != gen,
                              REORDER_SECONDS):
                raise ChainBroken(f"position {first} came without the ones before it")
            if self.gen != gen:
                raise ChainBroken("the head was replaced")
        for k, item in enumerate(items):
            if first + k == self.pos + 1:
                self.apply(*item)
                self._append(item)
        self.cond.notify_all()
        if self.mode == "sync":
            self._await_durable(first + len(items) - 1)

    def _append(self, item: Item) -> None:
        self.pos += 1
        if self.successor is None:
            self.durable = self.pos  # the tail: applied here is on the whole chain
            return
        self._log[self.pos] = item
        if not self._broken:
            if not self._out:
                self._out_since = time.monotonic()
            self._out.append((self.pos, item))
            self._flush()

    def _flush(self) -> None:
        """Wake the sender if it may send now (it sends outside the lock)."""
        if self._out and self._calls < IN_FLIGHT and not self._broken:
            self.cond.notify_all()

    def _send_loop(self) -> None:
        """Send batches in order, one thread, without the shard's lock: a Ray call's
        submission (pickling, task set-up) costs about as much CPU as applying an
        update, and a push (or pull) waiting behind it would pay for it."""
        while True:
            with self.cond:
                while not self._closed:
                    if not (self._out and self._calls < IN_FLIGHT and not self._broken):
                        self.cond.wait()
                        continue
                    linger = self._linger()
                    if linger <= 0:
                        break
                    self.cond.wait(linger)
                if self._closed:
                    return
                room = max(1, wire.CALL_BYTES // max(wire.nbytes(self._out[0][1]), 1))
                batch, self._out = self._out[:room], self._out[room:]
                self._calls += 1
                succ, gen, epoch = self.successor, self.gen, self._epoch
            first, last, items = batch[0][0], batch[-1][0], [i for _, i in batch]
            if wire.packable(items):
                meta, chunks = wire.pack(items)
                ref = succ.chain_push.remote(gen, first, meta, *chunks)
            else:  # anything but float32: as it is (pickled)
                ref = succ.chain_push.remote(gen, first, items)
            with self.cond:
                # A rewire meanwhile sent the log again: this call's outcome is moot.
                if epoch == self._epoch:
                    self._sent.append((last, ref, epoch))
                    self.cond.notify_all()

    def _linger(self) -> float:
        """Seconds the sender still waits for more pushes before sending (0: now)."""
        if self.mode != "async" or len(self._out) >= min(ASYNC_BATCH, self.max_lag):
            return 0.0
        return ASYNC_LINGER - (time.monotonic() - self._out_since)

    def _await_durable(self, pos: int) -> None:
        if not self._wait(lambda: self.durable >= pos or self._broken, ACK_SECONDS):
            raise ChainBroken(f"position {pos} not acknowledged by the tail in time")
        if self.durable < pos:
            raise ChainBroken(f"the chain broke before position {pos} reached the tail")

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
        """A new successor (None: this replica is the tail now); send it the log."""
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
            self.cond.notify_all()
        for t in (self._sender, self._completer):
            if t is not None:
                t.join(timeout=5)
        return not any(t is not None and t.is_alive() for t in (self._sender, self._completer))

    def _reconnect(self) -> None:
        self._epoch += 1
        self._broken = False
        self._sent.clear()  # outcomes of earlier sends no longer decide anything
        self._calls = 0
        self._out = []
        if self.successor is None:
            self.durable = self.pos
            self._log.clear()
        else:
            self._out = list(self._log.items())
            self._out_since = time.monotonic()
            self._flush()
        self.cond.notify_all()

    def _complete(self) -> None:
        """Collect acknowledgements in send order; a failure breaks the link."""
        while True:
            with self.cond:
                while not self._sent and not self._closed:
                    self.cond.wait()
                if self._closed:
                    return
                pos, ref, epoch = self._sent.popleft()
            error: Exception | None = None
            try:
                ray.get(ref)
            except ray.exceptions.RayError as e:
                error = e
            with self.cond:
                if epoch == self._epoch:
                    self._calls -= 1
                if error is None:
                    self.forwarded += 1
                    if pos > self.durable:  # an acknowledgement covers all before it
                        self.durable = pos
                        while self._log and next(iter(self._log)) <= pos:
                            self._log.popitem(last=False)
                        self.cond.notify_all()
                    if epoch == self._epoch:
                        self._flush()  # what was applied meanwhile, as one call
                    continue
                if epoch != self._epoch:
                    continue  # sent before a rewire: already sent again
                self._broken = True
                self.cond.notify_all()
            if isinstance(error, ray.exceptions.RayActorError):
                continue  # the successor died: the driver rewires (rewire sends again)
            time.sleep(RETRY_PAUSE)  # alive, its own successor broke: try it again
            with self.cond:
                if self._broken and epoch == self._epoch:
                    self._reconnect()
