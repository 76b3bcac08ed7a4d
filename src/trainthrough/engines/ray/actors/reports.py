"""What the ray engine's actors are told and what they report back, by name.

Most cross the process boundary as plain dicts (Ray pickles them), so each is a
``TypedDict``: the driver and the actors agree on the keys and their types, and a
caller may read them as the dicts they are. A shard's :class:`Pulled` parameters are a
named tuple, read by name or unpacked as ``(version, params)``. Importing this module
imports neither Ray nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, TypedDict

if TYPE_CHECKING:
    import torch


class Pulled(NamedTuple):
    """A shard's parameters as one ``pull`` returned them."""

    version: int  #: the shard's version (updates applied)
    params: dict[str, torch.Tensor]  #: its parameters (copies)


class WorkerSettings(TypedDict):
    """What every worker of a run is told at start (``WorkerActor.reset``)."""

    outage: str  #: "wait" (retry the shard) or "buffer" (stateless: compute on)
    merge_rule: str  #: how a backlog is merged when its shard is back
    merge_threshold: int  #: the 'scaled' rule's backlog size that keeps full steps
    backlog: int  #: buffered updates per shard before the oldest are merged
    read_from: str  #: "tail" (synchronous chains) or "head"
    scale: float  #: a worker's own push's share of a step (1/N when mean-aggregated)
    keep_copies: bool  #: keep the last pull and push for worker-copy recovery


class Progress(TypedDict):
    """A worker's counters (``WorkerActor.progress``), seconds unless said."""

    step: int  #: the next step it computes
    busy: float  #: computing
    idle: float  #: waiting for a shard that is down
    comm: float  #: pulls and pushes that went through
    pushes: int  #: pushes acknowledged
    acked: dict[int, int]  #: per shard, the highest sequence number acknowledged
    acked_pushes: dict[int, int]  #: per shard, how many pushes were acknowledged
    buffered: int  #: slices buffered during outages (stateless)
    backlog: int  #: slices buffered now
    outage: float  #: with a shard unreachable (waiting or buffering)
    outage_busy: float  #: computing, among ``outage``


class ShardStats(TypedDict):
    """A shard replica's counters (``ShardActor.stats``)."""

    name: str
    version: int  #: updates applied
    forwarded: int  #: forwards acknowledged by the successor
    sent_states: int  #: forwards that carried the whole state
    socket_sends: int  #: forwards that went over the link's socket
    lag: int  #: chain positions applied here and not yet on the rest of the chain
    position: int  #: chain position
    applied: dict[int, int]  #: per worker, the highest sequence number applied
    held: dict[int, int]  #: per worker, how many of its pushes this state holds


class _Failable(TypedDict, total=False):
    error: str  #: a write that failed (this one, or the previous background one)


class SaveInfo(_Failable):
    """One shard's answer to ``ShardActor.checkpoint``."""

    bytes: int  #: written (asynchronous: the payload, written in the background)
    payload: int  #: the checkpoint's payload bytes
    blocked: float  #: seconds the save held the shard
    name: str | None  #: the checkpoint's name (None: nothing saved)
    skipped: bool  #: not taken: the previous background write still ran


class RestoreInfo(_Failable):
    """One shard's answer to ``ShardActor.restore``."""

    step: int | None  #: the iteration restored to (None: nothing valid was saved)
    skipped: list[str]  #: one message per corrupt save passed over


class WriteStats(TypedDict):
    """A shard's checkpoint writes so far (``Persister.stats``)."""

    writes: int
    skipped: int  #: saves not taken (a write still ran)
    seconds: float  #: spent writing, prunes included


class CheckpointStats(WriteStats):
    """One shard's checkpoint writes (``ShardActor.checkpoint_stats``)."""

    last_write: float  #: the last write's durable write, seconds
    last_prune: float  #: the last write's prune, seconds
