"""What the controller and its rank processes say to each other, through the store.

The controller owns a ``TCPStore`` (on 127.0.0.1 unless the run spans a cluster or
the user named an address: :mod:`.net`) and outlives every rank, so the
store is where ranks that lost their group still meet. Values are JSON text (nothing
is pickled), and only control messages: plans, reports, requests, events, scores.
Nothing whose size grows with the model goes through the store (its server refuses a
value over 8 MiB, and :func:`put` refuses one over :data:`MAX_VALUE_BYTES`): the first
member evaluates in place and posts the scores (:mod:`.evals`), a restart's
perturbation is measured by the survivor (:mod:`.checkpoints`), and a joiner's state
travels over the process group (:mod:`trainthrough.dp.repair`). Call order for one run:

1. the controller starts the store and spawns ranks with a :data:`RankSpec`;
2. each rank connects, builds its replica and sets ``ready/<slot>/<inc>``;
3. once every member of attempt ``n`` is ready, the controller sets ``plan/<n>`` (a
   :class:`Plan`); a joining rank first reads ``join/<slot>/<inc>`` to learn ``n``;
4. the members form the group on ``PrefixStore(f"attempt{n}", store)`` and train,
   pushing events (:func:`post`: evaluations, checkpoints, failures, commits);
5. when a collective fails, or the controller asks for a change, every member sets
   ``report/<n>/<slot>`` (a :class:`Report`) and waits for ``plan/<n+1>``;
6. control requests (stop, a replacement is ready) go through the counter ``ctl``:
   the controller sets ``stop`` or ``grow`` first and then increments ``ctl``; the
   first member learns it from a thread waiting on ``ctl/<k>`` (no store round trip
   on the step path) and shares it in the commit vote, so every member acts on it
   after the same step.

Every message and report a rank process writes carries its fencing token, its
``[slot, inc]`` (:func:`sign`, once per process): the controller refuses (and records)
whatever comes from an incarnation it took out of the group (:mod:`.fencing`), and
every plan lists its members' incarnations (``Plan.incs``), so a process that wakes
after the group moved on reads that it is out and leaves.

Beside these, every rank process beats on ``beat/<slot>/<inc>`` (:mod:`.liveness`), and
one that ends on an error leaves its last words in ``error/<slot>/<inc>`` (a
:class:`~.messages.RankError`, :func:`write_last_words`): a key of its own, not the
event queue, so they arrive even if the process died in the middle of a post (the queue
waits for the message whose number it took).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from trainthrough.engines.gloo.messages import Message, RankError, Reported, parse
from trainthrough.engines.gloo.timing import PLAN_WAIT_SECONDS

if TYPE_CHECKING:
    import torch.distributed as dist


@dataclass(frozen=True)
class RunSpec:
    """What every rank process of a run is started with (plain values: it crosses the
    spawn pipe as JSON). ``config``: the resolved RunConfig as a dict; ``host``/``port``:
    the controller's store; ``t0``: the run's start (wall clock, for @time triggers);
    ``loop``: a user's own loop by reference (None: a workload's step); ``net``: where
    the rank's gloo binds (net.py); ``collective``/``gpus_per_rank``: dp/devices.py's
    choice for every rank; ``heartbeat``: seconds between the process's heartbeats
    (liveness.py); ``notice``: the rank takes SIGTERM as a preemption notice (notice.py;
    False where its host handles SIGTERM itself, a Ray actor)."""

    config: dict[str, Any]
    host: str
    port: int
    t0: float
    checkpoint_url: str
    loop: str | None = None
    net: dict[str, Any] | None = None
    collective: str = "gloo"
    gpus_per_rank: float = 0.0
    heartbeat: float = 1.0
    notice: bool = False


@dataclass(frozen=True)
class RankSpec:
    """One rank process: the run's :class:`RunSpec` and this incarnation of its slot.

    ``inc``: the slot's incarnation; ``mode``: ``fresh``, ``restart`` (loads checkpoint
    ``restore``; None: x0) or ``join``; ``attempt``: the plan it starts from;
    ``executed``/``ctl``/``applied``: the run's counters it carries on from; ``orders``:
    the failures it carries (faults.py).
    """

    run: RunSpec
    slot: int
    inc: int
    mode: str
    attempt: int
    executed: int
    ctl: int
    orders: list[dict[str, Any]]
    applied: int = 0
    restore: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankSpec:
        return cls(**{**d, "run": RunSpec(**d["run"])})


@dataclass(frozen=True)
class Plan:
    """Attempt ``n``: who forms the group, and what the members do first.

    ``action``: ``start`` (fresh or restarted ranks), ``join`` (a replacement joins:
    the first member broadcasts its state), ``rollback`` (redo the interrupted
    step), ``lossy`` (finish the interrupted step with the survivors'
    shares if ``complete``), ``exit`` (checkpoint-restart: every process ends and
    fresh ones start; ``members`` are the survivors, the first of which sends its
    replica as it was before the interrupted step), ``stop`` (end of the run).
    ``buckets_done``: allreduce buckets every survivor completed before the failure.
    ``uncount``: the failure struck between steps, so the attempt the survivors had
    begun does not count. ``sync``: the survivors disagree on the last committed
    step (one's last collective completed, another's did not): those behind take
    the state of one that reached ``logical``, and nothing in flight is completed.
    ``save``: the member that writes a just-in-time checkpoint of its replica (the last
    committed step, which every member holds) before it carries out the plan: the
    job is preempted and ``stop``s (None: no such save).
    """

    n: int
    members: list[int]
    action: str = "start"
    complete: bool = False
    buckets_done: int = 0
    uncount: bool = False
    sync: bool = False
    logical: int = 0
    incs: list[int] = field(default_factory=list)  # per member: its incarnation
    save: int | None = None
    save_inc: int | None = None  # the incarnation of ``save`` (a stale one does not save)

    def saves(self, slot: int, inc: int) -> bool:
        """Whether incarnation ``inc`` of ``slot`` is the one to write the just-in-time
        checkpoint."""
        return self.save == slot and self.save_inc in (None, inc)

    def admits(self, slot: int, inc: int) -> bool:
        """Whether incarnation ``inc`` of ``slot`` is a member of this attempt (an
        incarnation the plan does not name is out, even if its slot is in)."""
        if slot not in self.members:
            return False
        return not self.incs or self.incs[self.members.index(slot)] == inc


@dataclass(frozen=True)
class Report:
    """What a member tells the controller when its group ends.

    ``reason``: ``error`` (a collective failed or timed out) or ``ctl`` (it stopped
    at a step boundary because the controller asked). ``phase``/``buckets_done``
    locate the interrupted step; ``t`` is when the error surfaced; ``waited``: how long
    the failed collective waited (its full timeout: a member never came,
    :func:`~.timing.timed_out`).
    """

    slot: int
    reason: str
    phase: str = "boundary"
    buckets_done: int = 0
    executed: int = 0
    logical: int = 0
    t: float = field(default_factory=time.time)
    error: str = ""
    waited: float = 0.0
    inc: int = -1  # the incarnation of ``slot`` that reports (its fencing token)


def _tcp_store(host: str, port: int, timeout: float, **kwargs: Any) -> dist.TCPStore:
    """A ``TCPStore``; torch is imported here, not with this module: the specs and
    messages are read where torch is not wanted (a Ray node's rank host, which only
    starts rank processes, spends 1.4 s of CPU less without it)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, timeout=timedelta(seconds=timeout), **kwargs)


def serve(host: str, timeout: float) -> dist.TCPStore:
    """The controller's store, listening on ``host`` only (:func:`.net.store_host`).

    ``TCPStore`` binds its server to every interface when it opens the port itself,
    unauthenticated; so the socket is bound to ``host`` here and handed over. The store
    takes ownership of the descriptor (it closes it when it goes away), so the Python
    socket lets go of it: closing it here too would close whatever file later reuses
    that number (another library's socket, say).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(128)
        store = _tcp_store(host, sock.getsockname()[1], timeout, is_master=True,
                           wait_for_workers=False, master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()
    return store


def connect(host: str, port: int, timeout: float) -> dist.TCPStore:
    """A client of the controller's store at ``host:port`` (ranks call this first)."""
    return _tcp_store(host, port, timeout, is_master=False)


#: The value a closing :class:`Doorbell` leaves in the key its thread waits on: it wakes
#: that thread and means nothing else (no request, no event).
CLOSED = "-"


def request(store: dist.Store) -> int:
    """The controller asks the group for a change (``stop`` or ``grow`` set first):
    the counter ``ctl`` goes up by one, and ``ctl/<value>`` rings the members'
    :class:`Doorbell`. Returns the value of the request.

    The key is claimed, not overwritten: a process that closed its doorbell may have
    marked ``ctl/<value>`` already (:data:`CLOSED`), and every doorbell that waited on
    it has moved past it, so the request takes the next value instead.
    """
    while True:
        value = store.add("ctl", 1)
        if store.compare_set(f"ctl/{value}", "", "1") == b"1":
            return value


class Doorbell:
    """Counts keys ``<prefix>/<k>``, k = ``start``, ``start + 1``, ..., as they are set.

    A thread blocked in the store's ``wait`` on a connection of its own (it releases
    the GIL) learns of each at once: nobody polls. The first member's
    ballot reads :attr:`rung` instead of a store round trip every step, and the
    controller sleeps in :meth:`wait` until a rank posts an event. :meth:`close` ends
    the thread (it sets the key the thread waits for).
    """

    def __init__(self, store: dist.TCPStore, prefix: str, start: int) -> None:
        self._host, self._port, self.prefix = store.host, store.port, prefix
        self.start, self.rung, self.closed = start, 0, False
        #: the last key rung that another process set (not one a doorbell closing left)
        self.last = start - 1
        self._store = store  # the owner's connection, for close()
        self._event = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"doorbell-{prefix}")
        self._thread.start()
        # Whichever way the process ends (a bug's traceback included), not with the
        # thread still inside the store's wait: see close().
        atexit.register(self.close)

    @property
    def next_key(self) -> str:
        return f"{self.prefix}/{self.start + self.rung}"

    def _watch(self) -> None:
        try:
            own = _tcp_store(self._host, self._port, 30, is_master=False)
            while not self.closed:
                key = self.next_key
                own.wait([key], timedelta(days=1))
                if own.get(key) != CLOSED.encode():
                    self.last = self.start + self.rung
                self.rung += 1
                self._event.set()
        except Exception:  # the store went away with the run: nothing left to watch
            self._event.set()

    def wait(self, timeout: float) -> None:
        """Return once a key came since the last call, or after ``timeout`` seconds."""
        self._event.wait(timeout)
        self._event.clear()

    def close(self) -> None:
        atexit.unregister(self.close)
        if self.closed:
            return
        self.closed = True
        # The key is marked only if nobody set it: overwriting a request would hide it
        # from the other doorbells, and marking it without claiming it would make the
        # next request reuse a key they have already passed (request() skips a mark).
        with contextlib.suppress(Exception):  # the store is gone, and the thread with it
            self._store.compare_set(self.next_key, "", CLOSED)
        # Joined: a thread still inside the store's wait when the process exits aborts
        # it ("terminate called without an active exception").
        self._thread.join(timeout=5)


#: The largest value this protocol writes to the store. Control messages take a few
#: hundred bytes; the store's server refuses a value over 8 MiB by dropping the
#: connection, which the writer sees as a broken store much later. So a value near it
#: is refused here, at once, naming its key: whatever grows with the model or the
#: user's data travels over the process group or a file instead.
MAX_VALUE_BYTES = 1 << 20


def put(store: dist.Store, key: str, value: Any) -> None:
    """Write ``value`` as JSON under ``key``.

    Raises:
        ValueError: the JSON text is over :data:`MAX_VALUE_BYTES`.
    """
    text = json.dumps(value)
    if len(text) > MAX_VALUE_BYTES:  # ASCII: json.dumps escapes the rest
        raise ValueError(f"store value {key!r} is {len(text)} bytes, over the "
                         f"{MAX_VALUE_BYTES} a control message may take")
    store.set(key, text)


def get(store: dist.Store, key: str) -> Any:
    return json.loads(store.get(key))


def has(store: dist.Store, key: str) -> bool:
    return bool(store.check([key]))


#: This process's fencing token, ``(slot, inc)``, once it is a rank process (:func:`sign`).
_SENDER: tuple[int, int] | None = None


def sign(slot: int, inc: int) -> None:
    """Make this process incarnation ``inc`` of ``slot``: every message it posts carries
    that token (one rank process is one incarnation for its whole life)."""
    global _SENDER
    _SENDER = (slot, inc)


def sign_out() -> None:
    """Post unsigned again (a test that played a rank process in its own)."""
    global _SENDER
    _SENDER = None


def post(store: dist.Store, message: Message) -> None:
    """Append a message to the queue the controller drains, signed with this process's
    token (:func:`sign`).

    The slot number is taken atomically, so concurrent posters never overwrite each
    other.

    Raises:
        ValueError: the message is over :data:`MAX_VALUE_BYTES` (checked before its slot
            is taken: a slot taken and never written would stop the controller's reader).
    """
    wire = message.wire()
    if wire.get("sender") is None and _SENDER is not None:
        wire["sender"] = list(_SENDER)
    text = json.dumps(wire)
    if len(text) > MAX_VALUE_BYTES:
        raise ValueError(f"a {message.TYPE!r} message of {len(text)} bytes, over the "
                         f"{MAX_VALUE_BYTES} a control message may take")
    i = store.add("evq", 1) - 1
    store.set(f"evq/{i}", text)


class EventReader:
    """The controller's side of :func:`post`: drains events in order, once each.

    :attr:`bell` wakes the controller when the next one is posted; an event's key is
    deleted once read and rung past (the bell waits on it: a key deleted before it
    came to it would keep it waiting for ever).
    """

    def __init__(self, store: dist.TCPStore) -> None:
        self.store, self.seen, self.deleted = store, 0, 0
        self.bell = Doorbell(store, "evq", 0)

    def drain(self) -> list[dict[str, Any]]:
        out = []
        count = self.store.add("evq", 0)
        while self.seen < count:
            key = f"evq/{self.seen}"
            raw = self.store.get(key) if has(self.store, key) else CLOSED.encode()
            if raw == CLOSED.encode():
                break  # its poster took the number but has not written it yet
            out.append(json.loads(raw))
            self.seen += 1
        while self.deleted < min(self.seen, self.bell.start + self.bell.rung):
            self.store.delete_key(f"evq/{self.deleted}")
            self.deleted += 1
        return out


def write_plan(store: dist.Store, plan: Plan) -> None:
    put(store, f"plan/{plan.n}", asdict(plan))


def wait_plan(store: dist.Store, n: int) -> Plan:
    """Block until the controller publishes attempt ``n``.

    Raises:
        RuntimeError: (from the store) no plan within :data:`PLAN_WAIT_SECONDS`.
    """
    store.wait([f"plan/{n}"], timedelta(seconds=PLAN_WAIT_SECONDS))
    return Plan(**get(store, f"plan/{n}"))


def write_report(store: dist.Store, n: int, report: Report) -> None:
    """Write a member's report, then announce it in the event queue (the controller
    reads reports only when announced, rather than polling every member's key)."""
    put(store, f"report/{n}/{report.slot}", asdict(report))
    post(store, Reported(n=n, slot=report.slot))


def read_reports(store: dist.Store, n: int, slots: list[int]) -> dict[int, Report]:
    """The reports of attempt ``n`` that have arrived, by slot."""
    return {s: Report(**get(store, f"report/{n}/{s}")) for s in slots
            if has(store, f"report/{n}/{s}")}


def write_last_words(store: dist.Store, message: RankError) -> None:
    """A rank process ends on an error: what it says of it, read when its end is seen."""
    put(store, f"error/{message.slot}/{message.inc}", message.wire())


def read_last_words(store: dist.Store, slot: int, inc: int) -> RankError | None:
    """What incarnation ``inc`` of ``slot`` said as it ended on an error (None: nothing,
    it ended otherwise)."""
    key = f"error/{slot}/{inc}"
    if not has(store, key):
        return None
    m = parse(get(store, key))
    return m if isinstance(m, RankError) else None
