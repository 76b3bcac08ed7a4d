"""The bulk-synchronous parameter-server round, written once for every engine.

A round at logical step ``k``: pull the parameters from every shard, let every worker
compute its update for step ``k`` on them, and have every shard apply the aggregate of
its slices once (:meth:`~trainthrough.ps.shard.Shard.apply_aggregate`). Failures are
delivered at round boundaries (the host's injection point ``boundary``, before
:func:`bsp_round`), never inside it.

The host supplies the transport (:class:`RoundHost`): ``sim`` calls its shards and
workers in process; ``ray`` passes references between actors, so parameters go from
shards to workers and update slices from workers to shards without the driver.
Call order within a round: ``pull`` once, ``compute`` once, ``apply_parts`` once.
"""

from __future__ import annotations

from typing import Any, Protocol


class RoundHost(Protocol):
    """What one round needs from where shards and workers live."""

    def pull(self) -> Any:
        """The current parameters (or a handle to them)."""

    def compute(self, step: int, params: Any) -> list[list[Any]]:
        """Every worker's update for ``step``, split per shard: ``[worker][shard]``."""

    def apply_parts(self, step: int, parts: list[list[Any]], divide_by: int) -> bool:
        """Each shard applies the sum of its ``parts[shard]`` divided by ``divide_by``.

        Returns:
            False if the round could not complete (a component died meanwhile).
        """


def bsp_round(host: RoundHost, step: int, aggregate: str) -> int | None:
    """Run round ``step``; returns the number of updates applied (None: not completed).

    ``aggregate``: ``mean`` (the update is the workers' average) or ``sum``.
    """
    params = host.pull()
    per_worker = host.compute(step, params)
    if not per_worker:
        return None
    shards = len(per_worker[0])
    by_shard = [[w[i] for w in per_worker] for i in range(shards)]
    divide_by = len(per_worker) if aggregate == "mean" else 1
    return len(per_worker) if host.apply_parts(step, by_shard, divide_by) else None
