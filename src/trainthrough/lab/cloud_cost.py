"""A small cloud-pricing model: what reaching the target costs under each strategy.

Cost = nodes x hours x price per node-hour. Nodes are the workers plus every
process that holds parameters: one per shard, times the chain length for chain
replication (the extra replicas are extra nodes, as in the paper's argument).
Prices are our choice, stated in the report, and are flags to change, not facts:
an on-demand general-purpose node at $0.10/h and the same node on spot at $0.03/h
(spot is typically 60-90% cheaper and is what preemption-tolerant training buys).
"""

from __future__ import annotations

from dataclasses import dataclass

ON_DEMAND_PER_HOUR = 0.10
SPOT_PER_HOUR = 0.03


@dataclass(frozen=True)
class Pricing:
    on_demand: float = ON_DEMAND_PER_HOUR
    spot: float = SPOT_PER_HOUR


def nodes(strategy_replication: str, shards: int, replicas: int, workers: int) -> int:
    """Nodes a run occupies: workers, plus shard processes (x replicas for chains)."""
    per_shard = replicas if strategy_replication != "none" else 1
    return workers + shards * per_shard


def cost_to_target(seconds_to_target: float | None, node_count: int,
                   price_per_hour: float) -> float | None:
    """Dollars to reach the target (None when the run never reached it)."""
    if seconds_to_target is None:
        return None
    return node_count * seconds_to_target / 3600.0 * price_per_hour
