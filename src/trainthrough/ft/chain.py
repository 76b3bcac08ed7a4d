"""Chain replication of a shard: membership decisions, no tensors, no processes.

A chain is an ordered list of live replica ids: the head takes writes, the tail
serves reads in sync mode. On a death the chain *closes over* the dead replica
(its predecessor's successor becomes its successor); a dead head promotes its
successor with no rollback; a replacement joins at the tail after copying the
tail's state (atomically with respect to pushes, so with FIFO forwarding it misses
nothing in sync or async mode). The coordinator reports membership; the engine rewires actors
as these functions say.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChainChange:
    """The new chain and what the engine must do about it."""

    members: tuple[str, ...]
    promoted_head: str | None = None  # set when the head died
    rewire: tuple[tuple[str, str | None], ...] = ()  # (replica, its new successor)
    lost_all: bool = False  # no replica left: only a checkpoint can help


def successors(members: tuple[str, ...]) -> dict[str, str | None]:
    """Each replica's successor (the tail has none)."""
    return {m: (members[i + 1] if i + 1 < len(members) else None)
            for i, m in enumerate(members)}


def on_death(members: tuple[str, ...], dead: set[str]) -> ChainChange:
    """Close the chain over ``dead`` replicas."""
    alive = tuple(m for m in members if m not in dead)
    if not alive:
        return ChainChange((), lost_all=True)
    before, after = successors(members), successors(alive)
    rewire = tuple((m, after[m]) for m in alive if before[m] != after[m])
    promoted = alive[0] if members and members[0] in dead else None
    return ChainChange(alive, promoted, rewire)


def on_join(members: tuple[str, ...], new: str) -> ChainChange:
    """A replacement joins at the tail (after it has copied state from a live replica)."""
    if new in members:
        raise ValueError(f"replica {new} is already in the chain")
    grown = members + (new,)
    rewire = ((members[-1], new),) if members else ()
    return ChainChange(grown, None, rewire)
