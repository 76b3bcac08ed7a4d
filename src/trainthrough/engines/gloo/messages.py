"""The messages rank processes post to the controller (protocol.py, :func:`~.protocol.post`).

One frozen dataclass per kind; its :attr:`Message.TYPE` is the ``type`` it carries on the
wire. A rank builds one and posts it (``post(store, Resumed(iteration=7))``); the
controller turns each drained dict back into one with :func:`parse`, once, and then
dispatches on the class. The wire stays JSON (:meth:`Message.wire`): nothing is pickled,
so a message's fields are plain values only, and none grows with the model: the store
carries control messages only (protocol.py). What the controller used to receive as
tensors it now receives as numbers computed where the tensors are: the first member's
evaluations (:class:`Metrics`), its look-back copies' scores (:class:`Copies`) and a
restart's perturbation (:class:`Before`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar


@dataclass(frozen=True, kw_only=True)
class Message:
    """What every message has: when it was posted (the poster's wall clock), and who
    posted it: ``sender``, ``[slot, inc]`` of the rank process, its fencing token
    (set by :func:`~.protocol.post`; the controller refuses a message from an
    incarnation it took out of the group)."""

    TYPE: ClassVar[str] = ""
    t: float = field(default_factory=time.time)
    sender: list[int] | None = None

    def wire(self) -> dict[str, Any]:
        """The JSON object posted for it."""
        return {"type": self.TYPE, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class RankError(Message):
    """A rank process ends on an error: ``user`` (the user's to fix, one line: the run
    ends) or an exception (a bug, or the user's code raising: a failure of that rank).

    ``inc``: the incarnation of ``slot`` that raised; ``error``: the exception in one
    line (``ValueError: boom``); ``type_name``: its class (``builtins.ValueError``) and
    ``message`` its text, from which a caller may raise one of the same builtin type
    (never unpickled); ``logical``: the committed steps of the process (-1: none
    known); ``traceback``: the whole of it.
    """

    TYPE = "error"
    slot: int
    inc: int = -1
    user: str | None = None
    error: str = ""
    type_name: str = ""
    message: str = ""
    logical: int = -1
    traceback: str = ""


@dataclass(frozen=True, kw_only=True)
class Metrics(Message):
    """The first member evaluated its replica (the workload's ``evaluate``, or a user's
    loop's own) after executed iteration ``iteration``: the scores, never the tensors.
    ``final``: the last evaluation of the run on this process."""

    TYPE = "metrics"
    iteration: int
    logical: int
    final: bool
    applied: int
    metric: float
    loss: float
    extras: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Copies(Message):
    """Look-back copies the first member kept, scored where they are: ``[iteration,
    logical, applied, metric, loss, extras]`` each, oldest first; ``id`` the ask
    answered (0: unasked, sent as the member leaves)."""

    TYPE = "copies"
    id: int
    copies: list[list[Any]]


@dataclass(frozen=True, kw_only=True)
class Returned(Message):
    """What a user's ``train(loop)`` returned on ``slot`` (a JSON value)."""

    TYPE = "returned"
    slot: int
    value: Any


@dataclass(frozen=True, kw_only=True)
class Exit(Message):
    """A rank process's last words: counters, a hash of its replica, its commits, and
    its peak resident set size in bytes (``peak_rss``; 0 where the platform has none)."""

    TYPE = "exit"
    slot: int
    executed: int
    logical: int
    params_sha256: str
    outer_steps: int = 0
    peak_rss: int = 0
    history: list[list[Any]] = field(default_factory=list)  # (logical, attempt, members)


@dataclass(frozen=True, kw_only=True)
class Saved(Message):
    """Rank 0 wrote (or failed to write: ``error``) the checkpoint of ``iteration``."""

    TYPE = "saved"
    iteration: int
    payload: int
    blocked_seconds: float
    bytes: int = 0
    name: str | None = None
    error: str | None = None
    jit: bool = False  # a just-in-time save before the job stops (a preemption)


@dataclass(frozen=True, kw_only=True)
class Before(Message):
    """A restart's perturbation, measured by the first survivor as it leaves: from its
    replica before the interrupted step to the checkpoint of ``step`` (the newest that
    verifies, as the controller chooses; None: x0). NaN where it cannot tell (a user's
    loop restarting from its x0)."""

    TYPE = "before"
    step: int | None
    perturbation: float


@dataclass(frozen=True, kw_only=True)
class Reported(Message):
    """A member wrote its report of attempt ``n`` (protocol.write_report)."""

    TYPE = "report"
    n: int
    slot: int


@dataclass(frozen=True, kw_only=True)
class Failed(Message):
    """A rank struck itself as an order said, posted just before it dies.

    ``phase`` is the order's injection point, ``phase_kind`` the step phase it is in;
    ``local_steps``: with a relaxed sync, the local steps it takes along.
    """

    TYPE = "failure"
    ids: list[int]
    spec: str
    phase: str
    phase_kind: str
    iteration: int
    logical: int
    kind: str = "rank"
    mode: str | None = None
    pid: int | None = None
    local_steps: int | None = None
    pause_seconds: float | None = None  # mode=pause: when the controller continues it


@dataclass(frozen=True, kw_only=True)
class Noticed(Message):
    """Incarnation ``inc`` of ``slot`` got SIGTERM, its preemption notice (notice.py):
    it goes on until the group stops after a step without it. ``spec``/``notice_seconds``:
    an injected ``mode=preempt`` failure (None: the signal came from outside);
    ``logical``: its committed steps when the notice came (-1: unknown)."""

    TYPE = "notice"
    slot: int
    inc: int
    pid: int
    logical: int = -1
    spec: str | None = None
    notice_seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class Reformed(Message):
    """The first member of attempt ``n`` carried out its plan's ``action``;
    ``perturbation``: measured after a rollback or lossy re-formation; a ``join``: the
    bytes of the state share and the seconds the first member spent in it."""

    TYPE = "reformed"
    n: int
    ranks: list[int]
    action: str
    perturbation: float | None = None
    state_bytes: int | None = None
    transfer_seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class StepCompleted(Message):
    """The survivors completed the interrupted step without the lost shares."""

    TYPE = "completed"
    micro_dropped: int
    samples_dropped: int


@dataclass(frozen=True, kw_only=True)
class Resumed(Message):
    """The first commit after a recovery: the recoveries open end here."""

    TYPE = "resumed"
    iteration: int


@dataclass(frozen=True, kw_only=True)
class Awake(Message):
    """A paused rank runs again (``mode=pause`` ended): if the group never noticed, its
    failure event is spent; if it was fenced meanwhile, this is its first refused write."""

    TYPE = "awake"
    spec: str
    paused_seconds: float


KINDS: dict[str, type[Message]] = {
    m.TYPE: m for m in (RankError, Metrics, Copies, Returned, Exit, Saved, Before,
                        Reported, Failed, Noticed, Reformed, StepCompleted, Resumed, Awake)}


def parse(wire: dict[str, Any]) -> Message:
    """The message a drained JSON object holds.

    Raises:
        RuntimeError: a kind no rank sends, or fields its kind does not have.
    """
    cls = KINDS.get(str(wire.get("type")))
    if cls is None:
        raise RuntimeError(f"dist engine: a rank sent an unknown message {wire.get('type')!r}")
    names = {f.name for f in fields(cls)}
    extra = sorted(set(wire) - names - {"type"})
    if extra:
        raise RuntimeError(f"dist engine: a {cls.TYPE!r} message with unknown fields {extra}")
    return cls(**{k: v for k, v in wire.items() if k != "type"})
