"""The virtual clock and the cost model that alone advances it.

No decision in ``sim`` reads the wall clock: time moves only by what the cost model
charges (compute per step, bytes over the network, bytes to storage, detection and
restart delays), which is what makes a seed reproduce bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainthrough.config import CostModel


@dataclass
class VirtualClock:
    """Simulated seconds since the start of the run."""

    now: float = 0.0

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("time does not run backwards")
        self.now += seconds
        return self.now


class Costs:
    """Turns work into simulated seconds."""

    def __init__(self, model: CostModel, step_seconds: float) -> None:
        self.m = model
        self.compute = step_seconds * model.compute_scale

    def network(self, nbytes: float, requests: int = 1) -> float:
        return nbytes / self.m.network_bandwidth + requests * self.m.network_latency

    def storage(self, nbytes: float) -> float:
        return nbytes / self.m.storage_bandwidth

    def bsp_step(self, param_bytes: int, workers: int, shards: int) -> float:
        """One bulk-synchronous iteration: compute, then pull and push through K links.

        Each shard sends its slice to, and receives an update from, every worker, so
        the busiest link carries ``2 * workers * param_bytes / shards`` bytes.
        """
        return self.compute + self.network(2 * workers * param_bytes / shards, requests=2)

    def worker_step(self, param_bytes: int, shards: int) -> float:
        """One worker's pull-compute-push when workers run at their own pace (SSP)."""
        return self.compute + self.network(2 * param_bytes / shards, requests=2)

    @property
    def detection(self) -> float:
        return self.m.detection_seconds

    @property
    def restart(self) -> float:
        return self.m.restart_seconds
