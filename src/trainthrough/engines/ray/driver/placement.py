"""Where a data-parallel rank goes on a Ray cluster: a pure decision, no Ray calls.

:class:`RayDataParallel` (dp.py) reads the cluster (live nodes and their addresses) and
its own ranks (where each was placed, whether it lives or died), asks :func:`place`,
and starts the actor with hard affinity on the node it names. The rules, in order:

1. ``fresh`` (the run's first ranks): round the live nodes by slot, in id order, so
   every node gets ranks (Ray's best-effort SPREAD did not always do that);
2. a live node that hosts none of the run's ranks and saw none die;
3. the node the slot's previous process ran on (``home``), while Ray lists it alive:
   right after a death nobody knows yet whether the process or its host was lost (Ray
   declares a node dead only after missed health checks). A process crash is replaced
   where it was; on a host that is gone the actor never starts, and dp.py places it
   again, by the next rule;
4. a replacement (``join``) whose rank went with its host (a node where a rank died is
   no longer alive): a node that joined after the run began, the lost host's
   successor, which takes all of that host's ranks back; while there is none, wait
   (None), at most :data:`NODE_WAIT` seconds;
5. the live node with the fewest of the run's live ranks, one where none died first.

Without rule 3, two ranks of a host not yet declared dead were placed one on it (it
had fewer live ranks) and the other, the tie broken, on the survivors' host, for good.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: The longest a replacement for a rank lost with its host waits for a node that can take
#: it (the lost host's successor) before it goes beside the survivors. Meanwhile the
#: group trains without it; a new node counts as soon as Ray lists it alive.
NODE_WAIT = 60.0


@dataclass(frozen=True)
class Placement:
    """Where a rank goes, and the rule that chose it (recorded as ``rank-placed``)."""

    node: str
    address: str
    why: str


@dataclass(frozen=True)
class RankAt:
    """One of the run's rank processes that was placed: its node, and whether it lives
    (``alive``) or died (``died``: ended by a signal or its node; a clean end is
    neither)."""

    node: str
    alive: bool
    died: bool


def place(slot: int, mode: str, alive: Mapping[str, str], known: set[str],
          ranks: list[RankAt], waited: float, home: str | None = None) -> Placement | None:
    """The node for rank ``slot`` (None: wait for one; see the module docstring).

    Args:
        mode: ``fresh``, ``restart`` or ``join``.
        alive: the live nodes, id -> address.
        known: the live nodes when the run's first ranks were placed.
        ranks: the run's rank processes placed so far.
        waited: seconds since the rank could first have been placed.
        home: the node the slot's previous process ran on (None: it has none).
    """
    nodes = sorted(alive)
    if mode == "fresh":
        node = nodes[slot % len(nodes)]
        return Placement(node, alive[node], "round the live nodes by slot")
    live = dict.fromkeys(nodes, 0)
    died: set[str] = set()
    for r in ranks:
        if r.alive and r.node in live:
            live[r.node] += 1
        elif r.died:
            died.add(r.node)
    free = [n for n in nodes if live[n] == 0 and n not in died]
    if free:
        return Placement(free[0], alive[free[0]], "a node with none of the run's ranks")
    if home is not None and home in alive:
        return Placement(home, alive[home], "the node its rank ran on")
    host_lost = any(n not in alive for n in died)
    if mode == "join" and host_lost:
        new = [n for n in nodes if n not in known and n not in died]
        if new:
            node = min(new, key=lambda n: (live[n], n))
            return Placement(node, alive[node], "a node that joined after a host was lost")
        if waited < NODE_WAIT:
            return None
    node = min(nodes, key=lambda n: (live[n], n in died, n))
    why = "the fewest live ranks" + (f" (no new node within {NODE_WAIT:.0f} s of a lost "
                                     "host)" if host_lost else "")
    return Placement(node, alive[node], why)
