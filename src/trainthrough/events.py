"""The records of ``events.jsonl``: one frozen dataclass per kind of event.

Every engine (``sim``, ``gloo``, Ray's data parallel and parameter server) and the
checkpointer build these records and hand them to their emit function, which is typed
to take an :class:`Event` (mypy refuses a dict). The run context stamps the record
(:meth:`trainthrough.engines.base.RunContext.emit`) and passes the JSON dictionary
to the callbacks, so ``Callback.on_event`` keeps receiving a plain :data:`Record`
(the public API) and the recorder writes it as one line of ``events.jsonl``.

Contract:

- ``Event.type`` is the class's tag (a class variable, the ``"type"`` key of the
  record); :data:`KINDS` maps every tag to its class, and no two classes share one.
- :meth:`Event.to_record` gives the JSON dictionary: ``{"type": tag, field: value,
  ...}`` in field order. A field without a default is always written (``None`` as
  ``null``); a field whose default is ``None`` is one some engines do not have, and is
  left out of the record while it is ``None``. A field's key is its name, except
  where :func:`key` names another (``for``, ``async``: Python keywords).
- :func:`parse` reads a record back into its class; the stamps every record gets
  (:data:`STAMPS`: ``sim_seconds``, ``wall_seconds``) are not fields. ``strict``
  refuses unknown keys and values of the wrong type, which is how the tests check
  that ``events.jsonl`` has exactly this schema.
- :func:`schema_markdown` renders the tables of ``docs/events.md``'s generated
  section; a test keeps the page equal to it.

A leaf: it imports nothing of trainthrough, so that every layer that emits (the
engines, :mod:`trainthrough.ft.checkpointer`) can import it. The ``rank→controller``
messages of the gloo engine (``engines/gloo/protocol.py``) are a wire protocol, not
events: the controller turns the ones it records into these classes.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union, get_args, get_origin, get_type_hints

#: One line of ``events.jsonl`` as a JSON object (what ``Callback.on_event`` receives).
Record = dict[str, Any]

#: Keys every record gets from the run context, not from its event.
STAMPS = ("sim_seconds", "wall_seconds")
#: The markers around the generated section of ``docs/events.md``.
SCHEMA_BEGIN, SCHEMA_END = "<!-- schema:begin -->", "<!-- schema:end -->"


def key(name: str, default: Any = dataclasses.MISSING) -> Any:
    """A field written under ``name`` (for a key that is a Python keyword)."""
    return field(default=default, metadata={"key": name})


@dataclass
class Recovery:
    """One recovery: what failed, when, how long it took, how far it moved the model.

    Also an entry of ``summary.json``'s ``recoveries`` (``RunResult.recoveries``); the
    ``recovery`` event (:class:`RecoveryEnded`) writes these fields and its own.
    """

    failed: list[str]
    at_iteration: int
    recovery_seconds: float
    perturbation_norm: float
    perturbation_norm_lost: float = 0.0
    action: str = ""
    restored_from: int | None = None
    # worker-copy recovery only: rows by source, the copy's lag, messages and bytes
    # (ft/worker_copy.py's record); None for every other action.
    worker_copy: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every record: its tag and how it is written."""

    type: ClassVar[str] = ""

    def to_record(self) -> Record:
        """The JSON dictionary written to ``events.jsonl`` (before the stamps)."""
        out: Record = {"type": self.type}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is None and value is None:
                continue  # a field this engine does not have
            if isinstance(value, Recovery):
                out.update(dataclasses.asdict(value))
            else:
                out[f.metadata.get("key", f.name)] = value
        return out


# -- failures and their recovery ------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Failure(Event):
    """A failure was delivered (gloo: posted by the rank just before it strikes itself)."""

    type: ClassVar[str] = "failure"
    iteration: int  #: the executed iteration it struck at
    kind: str  #: ``shard``, ``worker`` (parameter server), ``rank`` (data parallel)
    ids: list[int]  #: the components struck (shard, worker or rank indices)
    spec: str  #: the failure spec as written
    phase: str | None = None  #: dp: the point it struck (``boundary``, ``allreduce:K``, ...)
    phase_kind: str | None = None  #: gloo: the phase's kind (``allreduce`` for ``allreduce:K``)
    mode: str | None = None  #: dp: ``crash`` or ``hang``
    during_recovery: bool | None = None  #: sim: it struck while a recovery was under way
    logical: int | None = None  #: gloo: the logical iteration
    pid: int | None = None  #: gloo: the rank's process
    member: str | None = None  #: ray ps: the actor's name
    in_service: bool | None = None  #: ray ps: false for a replacement not yet serving


@dataclass(frozen=True, kw_only=True)
class FailureSkipped(Failure):
    """sim dp: a spec fell due but every rank it names was already down (not counted)."""

    type: ClassVar[str] = "failure-skipped"


@dataclass(frozen=True, kw_only=True)
class Detection(Event):
    """The failure was noticed."""

    type: ClassVar[str] = "detection"
    iteration: int  #: where the failure struck (ray ps: the logical iteration)
    failed: list[str] | None = None  #: names: ``shard1``, ``worker0``, ``rank2``
    detection_seconds: float | None = None  #: real engines: from the strike to the notice
    survivors: list[int] | None = None  #: gloo: the rank slots that reported
    member: str | None = None  #: ray ps: the actor that died
    kind: str | None = None  #: ray ps: ``shard`` or ``worker``


@dataclass(frozen=True, kw_only=True)
class RecoveryEnded(Event):
    """A recovery ended: the fields of :class:`Recovery`, then the engine's own."""

    type: ClassVar[str] = "recovery"
    recovery: Recovery  #: written as its fields, not under a key
    phase: str | None = None  #: dp: the phase the failure struck (``allreduce`` for any K)
    logical_iteration: int | None = None  #: sim: where training goes on
    ranks: list[int] | None = None  #: sim dp: the group after recovery
    detection_seconds: float | None = None  #: gloo: from the strike to the notice
    busy_during_outage: float | None = None  #: ray ps: share of the outage spent computing


# -- parameter server on Ray ------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ShardDown(Event):
    """A shard with no live replica left is down until its replacement serves."""

    type: ClassVar[str] = "down"
    shard: int
    iteration: int


@dataclass(frozen=True, kw_only=True)
class ShardUp(Event):
    """The replacement serves, restored as the recovery policy decided."""

    type: ClassVar[str] = "up"
    shard: int
    iteration: int
    restored_from: int | None  #: the checkpoint's iteration; null: none was loaded
    #: a wiped chain's restore: the acknowledged pushes (updates) it did not bring back,
    #: beyond what an earlier restore found (in the summary's ``acknowledged_lost``)
    acknowledged_lost: int | None = None


@dataclass(frozen=True, kw_only=True)
class Failover(Event):
    """A chain promoted its next replica (no downtime beyond detection)."""

    type: ClassVar[str] = "failover"
    shard: int
    head: str  #: the new head's name


@dataclass(frozen=True, kw_only=True)
class ReplicaJoin(Event):
    """A new replica copied the chain's tail and joined it."""

    type: ClassVar[str] = "replica-join"
    shard: int
    member: str
    chain: list[str]  #: the members after the join


@dataclass(frozen=True, kw_only=True)
class ReplacementLost(Event):
    """A replacement died before it served; another is started for the same loss."""

    type: ClassVar[str] = "replacement-lost"
    member: str
    kind: str
    replaced_by: str
    for_: str = key("for")  #: the member whose loss it replaced


@dataclass(frozen=True, kw_only=True)
class SpareReady(Event):
    """A warm spare started after a failure is ready (the advisor reads it)."""

    type: ClassVar[str] = "spare-ready"
    member: str
    after_failure: float  #: seconds from the failure


@dataclass(frozen=True, kw_only=True)
class ZookeeperAbsent(Event):
    """Its ZooKeeper node vanished but the replica answers: it joins again."""

    type: ClassVar[str] = "zookeeper-absent"
    member: str
    shard: int
    action: str  #: ``rejoin``


@dataclass(frozen=True, kw_only=True)
class ZookeeperRejoined(Event):
    """The member is registered in ZooKeeper again."""

    type: ClassVar[str] = "zookeeper-rejoined"
    member: str


@dataclass(frozen=True, kw_only=True)
class Fenced(Event):
    """Its node vanished and it did not answer in time: killed, the chain fails over."""

    type: ClassVar[str] = "fenced"
    member: str
    shard: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class ZookeeperSilent(Event):
    """Ray saw the member die and ZooKeeper did not report it in the grace period."""

    type: ClassVar[str] = "zookeeper-silent"
    member: str
    shard: int
    waited_seconds: float


# -- data parallel ----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Reform(Event):
    """The survivors formed a smaller group (rollback, lossy-forward)."""

    type: ClassVar[str] = "reform"
    ranks: list[int]  #: the group's rank slots
    iteration: int | None = None  #: sim: the executed iteration
    n: int | None = None  #: gloo: the group's incarnation
    action: str | None = None  #: gloo: ``rollback`` or ``lossy``
    reform_seconds: float | None = None  #: gloo: from detection


@dataclass(frozen=True, kw_only=True)
class RankJoined(Event):
    """Replacement ranks joined the group."""

    type: ClassVar[str] = "rank-joined"
    ranks: list[int]  #: the group after the join
    slots: list[int]  #: the joiners
    bytes: int | None = None  #: state sent to the joiners
    n: int | None = None  #: gloo: the group's incarnation
    action: str | None = None  #: gloo: ``join``
    join_seconds: float | None = None  #: gloo: from the request to grow
    transfer_seconds: float | None = None  #: gloo: the first member's time in the state share


@dataclass(frozen=True, kw_only=True)
class RankPlaced(Event):
    """Ray dp on a cluster: a rank process was placed on a node, and why there."""

    type: ClassVar[str] = "rank-placed"
    slot: int  #: the rank's slot
    mode: str  #: ``fresh``, ``restart`` or ``join`` (a replacement)
    node: str  #: the Ray node id
    address: str  #: the node's address
    why: str  #: the rule that chose it (dp.py ``RayDataParallel.place``)
    waited_seconds: float  #: how long the replacement waited for a node to take it


@dataclass(frozen=True, kw_only=True)
class RankErrored(Event):
    """gloo, Ray dp: a rank process ended on an exception of its own (the user's code,
    or the rank's): a failure of that rank, recovered until it repeats the same way
    more than ``max_restarts`` times in a row."""

    type: ClassVar[str] = "rank-error"
    slot: int  #: the rank's slot
    error: str  #: the exception in one line (``ValueError: boom``)
    logical: int  #: the committed steps of the process when it raised (-1: before any)
    traceback: str  #: the whole traceback, as the rank printed it


@dataclass(frozen=True, kw_only=True)
class RankSilent(Event):
    """gloo, Ray dp: a rank process's heartbeat stopped for the liveness timeout (it is
    stopped or frozen): it is ended, and its loss recovered like a death."""

    type: ClassVar[str] = "rank-silent"
    slot: int  #: the rank's slot
    silent_seconds: float  #: since its heartbeat was last seen moving


@dataclass(frozen=True, kw_only=True)
class RankFenced(Event):
    """gloo, Ray dp, sim: the controller took incarnation ``inc`` of a rank out of the
    group: whatever that process writes from now on is refused (``write-refused``), and
    if it ever runs again it finds itself out and leaves. ``reason``: ``silent`` (its
    heartbeat stopped: it is also ended), ``no-report`` (alive but silent when its group
    broke: a paused or hung rank, not ended), ``straggler`` (it missed the straggler
    deadline), ``lost`` (its end was reported and the group went on without it: a rank
    on a host cut off, which Ray reports ended, may run on and write after the heal)."""

    type: ClassVar[str] = "rank-fenced"
    slot: int  #: the rank's slot
    inc: int  #: the incarnation of the slot taken out
    reason: str


@dataclass(frozen=True, kw_only=True)
class WriteRefused(Event):
    """gloo, Ray dp, sim (a cut-off rank after the heal): a message or report from an
    incarnation no longer in the group (one fenced, ``rank-fenced``, or replaced in its
    slot) came in, and was dropped unread."""

    type: ClassVar[str] = "write-refused"
    slot: int
    inc: int
    message: str  #: the kind of message refused (``report``, ``exit``, ``metrics``, ...)


@dataclass(frozen=True, kw_only=True)
class PauseEnded(Event):
    """gloo, sim: a ``mode=pause`` failure ended: the controller continued (SIGCONT) the
    stopped process (sim: on the virtual clock). ``member``: whether it was still a member of the group then (a
    pause the group never noticed); if not, it was fenced and leaves."""

    type: ClassVar[str] = "pause-ended"
    slot: int
    inc: int
    paused_seconds: float
    member: bool


@dataclass(frozen=True, kw_only=True)
class PartitionHealed(Event):
    """sim: a ``mode=partition`` cut ended: the rank, alive all along on the side
    without the controller, can reach the group again (on the virtual clock).
    ``member``: whether it was still a member then (a cut shorter than the collective
    timeout: the group waited it out); if not, it was fenced at the timeout, what it
    sends now is refused (``write-refused``), and it leaves."""

    type: ClassVar[str] = "partition-healed"
    slot: int
    inc: int
    cut_seconds: float
    member: bool


@dataclass(frozen=True, kw_only=True)
class PreemptNotice(Event):
    """gloo: a rank process got SIGTERM, its preemption notice: it goes on until its
    group stops after a step, then leaves (a drain, not a failure). sim: a
    ``mode=preempt`` spec struck, on the virtual clock."""

    type: ClassVar[str] = "preempt-notice"
    slot: int  #: the rank's slot
    logical: int  #: the steps it had committed when the notice came (-1: unknown)
    source: str  #: ``injected`` (a ``mode=preempt`` spec) or ``signal`` (from outside)
    pid: int | None = None  #: gloo: its process (sim has none)
    spec: str | None = None  #: the failure spec of an injected one
    notice_seconds: float | None = None  #: injected: until the SIGKILL if it has not left


@dataclass(frozen=True, kw_only=True)
class Drained(Event):
    """gloo, sim: ranks with a preemption notice left their group at a step boundary,
    the step committed: nothing is rolled back or redone; the rest go on without them."""

    type: ClassVar[str] = "drained"
    slots: list[int]  #: the ranks that left
    logical: int  #: the last step committed with them
    ranks: list[int]  #: the group after they left (joiners taken in at the same time too)
    n: int | None = None  #: gloo: the group's incarnation after it


@dataclass(frozen=True, kw_only=True)
class PreemptExpired(Event):
    """gloo, sim: a rank's preemption notice ran out before it left: it is SIGKILLed,
    and its loss recovered like a crash."""

    type: ClassVar[str] = "preempt-expired"
    slot: int
    notice_seconds: float
    pid: int | None = None  #: gloo: its process (sim has none)


@dataclass(frozen=True, kw_only=True)
class JobPreempted(Event):
    """gloo: the whole job got SIGTERM (or every rank its notice): the group stopped
    after a step and a live member wrote a just-in-time checkpoint, so ``--resume``
    goes on from the last committed step."""

    type: ClassVar[str] = "job-preempted"
    logical: int  #: the last step the group committed (-1: unknown)
    saved: int | None  #: the step of the checkpoint written (null: none could be)
    seconds: float  #: from the notice to the end of the save


@dataclass(frozen=True, kw_only=True)
class Restored(Event):
    """Checkpoint-restart chose its checkpoint, before the new processes start."""

    type: ClassVar[str] = "restored"
    step: int  #: the checkpoint every restarted rank loads (0: initial values)


@dataclass(frozen=True, kw_only=True)
class Completed(Event):
    """Lossy-forward finished a step without the lost ranks' share."""

    type: ClassVar[str] = "completed"
    micro_dropped: int
    samples_dropped: int


@dataclass(frozen=True, kw_only=True)
class TrainingResumed(Event):
    """gloo: the first step committed after a recovery; the group trains again."""

    type: ClassVar[str] = "training-resumed"
    iteration: int


# -- checkpoints ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class CheckpointSaved(Event):
    """A save exists (an asynchronous one once its background write is done)."""

    type: ClassVar[str] = "checkpoint"
    iteration: int  #: the logical iteration saved
    bytes: int  #: everything written: tensors, headers, manifests
    blocked_seconds: float  #: training blocked
    async_: bool = key("async")
    fraction: float  #: 1.0 for a full save, r for a prioritized one
    names: list[str]  #: one per shard, or one for a data-parallel group
    why: str | None = None  #: a save no policy asked for: ``preempt`` (just in time)


@dataclass(frozen=True, kw_only=True)
class CheckpointFailed(Event):
    """The storage refused a write (or, ray ps, a shard failed restoring)."""

    type: ClassVar[str] = "checkpoint-failed"
    iteration: int | None = None  #: the save's iteration (none when restoring)
    message: str


@dataclass(frozen=True, kw_only=True)
class CheckpointCorrupt(Event):
    """A checkpoint failed verification on load; the previous valid one is used."""

    type: ClassVar[str] = "checkpoint-corrupt"
    message: str


@dataclass(frozen=True, kw_only=True)
class CheckpointAbandoned(Event):
    """sim: a background write in flight when a failure struck never completes."""

    type: ClassVar[str] = "checkpoint-abandoned"
    rank: int | None = None  #: sim dp: the writing rank that failed


@dataclass(frozen=True, kw_only=True)
class CheckpointSkipped(Event):
    """ray ps: a save fell due while the previous write still ran on those shards."""

    type: ClassVar[str] = "checkpoint-skipped"
    iteration: int
    shards: int  #: how many shards were still writing


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    """``--resume`` restored the newest valid checkpoint (the run's second part)."""

    type: ClassVar[str] = "resumed"
    iteration: int
    logical_iteration: int
    max_iterations: int | None  #: the run's budget (null: the workload's default)


_ALL: tuple[type[Event], ...] = (
    Failure, FailureSkipped, Detection, RecoveryEnded,
    ShardDown, ShardUp, Failover, ReplicaJoin, ReplacementLost, SpareReady,
    ZookeeperAbsent, ZookeeperRejoined, Fenced, ZookeeperSilent,
    Reform, RankJoined, RankPlaced, RankErrored, RankSilent, RankFenced, WriteRefused,
    PauseEnded, PartitionHealed, PreemptNotice, Drained, PreemptExpired, JobPreempted,
    Restored, Completed, TrainingResumed,
    CheckpointSaved, CheckpointFailed, CheckpointCorrupt, CheckpointAbandoned,
    CheckpointSkipped, Resumed)
#: Every kind of event, by its tag.
KINDS: dict[str, type[Event]] = {c.type: c for c in _ALL}
assert len(KINDS) == len(_ALL) and "" not in KINDS, "one distinct tag per event class"


# -- reading back -------------------------------------------------------------------------
def _hints(cls: type[Event]) -> dict[str, Any]:
    return get_type_hints(cls)


def columns(cls: type[Event]) -> list[tuple[str, Any, bool]]:
    """The keys a record of ``cls`` may have: (key, type, always written), in order."""
    hints = _hints(cls)
    out: list[tuple[str, Any, bool]] = []
    for f in dataclasses.fields(cls):
        if hints[f.name] is Recovery:
            rhints = get_type_hints(Recovery)
            out += [(r.name, rhints[r.name], True) for r in dataclasses.fields(Recovery)]
        else:
            out.append((f.metadata.get("key", f.name), hints[f.name], f.default is not None))
    return out


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a field's type (a float NaN is written as null)."""
    if hint is Any:
        return True
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, h) for h in get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value is None
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        (item,) = get_args(hint)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    return isinstance(value, hint)


def parse(record: Record, strict: bool = True) -> Event:
    """Read one ``events.jsonl`` record back into its class.

    Raises:
        ValueError: the tag is unknown, a field is missing, or (``strict``) a key is
            unknown or a value does not fit its field's type.
    """
    cls = KINDS.get(str(record.get("type")))
    if cls is None:
        raise ValueError(f"unknown event type {record.get('type')!r}")
    rest = {k: v for k, v in record.items() if k != "type" and k not in STAMPS}
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if hints[f.name] is Recovery:
            names = [r.name for r in dataclasses.fields(Recovery)]
            missing = [n for n in names if n not in rest]
            if missing:
                raise ValueError(f"{cls.type}: missing {missing}")
            kwargs[f.name] = Recovery(**{n: rest.pop(n) for n in names})
            continue
        k = f.metadata.get("key", f.name)
        if k in rest:
            kwargs[f.name] = rest.pop(k)
        elif f.default is dataclasses.MISSING:
            raise ValueError(f"{cls.type}: missing {k!r}")
    if strict:
        if rest:
            raise ValueError(f"{cls.type}: unknown keys {sorted(rest)}")
        for k, hint, _ in columns(cls):
            if k in record and not _fits(record[k], hint):
                raise ValueError(f"{cls.type}: {k}={record[k]!r} is not {_type_name(hint)}")
    return cls(**kwargs)


def _type_name(hint: Any) -> str:
    if get_origin(hint) in (Union, types.UnionType):
        return " | ".join(_type_name(h) for h in get_args(hint))
    if hint is type(None):
        return "null"
    if get_origin(hint) is not None:
        return str(hint).replace("typing.", "")
    return str(getattr(hint, "__name__", hint))


def schema_markdown() -> str:
    """The tables of ``docs/events.md``'s schema section, one per kind (a ``float`` is
    ``null`` where it is NaN; a field written "when set" is absent otherwise)."""
    lines: list[str] = []
    for tag, cls in KINDS.items():
        lines += [f"### `{tag}` ({cls.__name__})", "", (cls.__doc__ or "").strip().replace("``", "`"), "",
                  "| key | type | written |", "| --- | --- | --- |"]
        for k, hint, always in columns(cls):
            args = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
            shown = " or ".join(_type_name(h) for h in args if h is not type(None))
            if always and type(None) in args:
                shown += " or null"
            lines.append(f"| `{k}` | {shown} | {'always' if always else 'when set'} |")
        lines.append("")
    return "\n".join(lines)


def write_schema(text: str) -> str:
    """``text`` (``docs/events.md``) with its generated section replaced by
    :func:`schema_markdown`'s tables."""
    head, _, rest = text.partition(SCHEMA_BEGIN + "\n")
    _, _, tail = rest.partition(SCHEMA_END)
    return f"{head}{SCHEMA_BEGIN}\n\n{schema_markdown()}\n{SCHEMA_END}{tail}"


if __name__ == "__main__":
    print(schema_markdown())
