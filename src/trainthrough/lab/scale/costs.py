"""What each action of a recovery costs on the virtual clock, for one cluster size.

Byte counts over bandwidths (times the efficiency measured here), and fixed latencies
measured here (lab/scale/measured.py); the rendezvous is the one cost that grows with
the number of ranks ``n``. Remote storage is shared: ``n`` accelerators writing (or
reading) at once get ``min(link, total / n)`` each.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainthrough.lab.scale.params import ScaleParams

GB = 1e9
STORES = ("remote", "memory")  #: where checkpoints go: remote storage, a peer's memory


@dataclass(frozen=True)
class ScaleCosts:
    """Seconds, for a group of ``n`` ranks."""

    n: int
    detect: float  #: failure to the survivors knowing
    reform: float  #: survivors (or a grown group) build a new communicator
    transfer: float  #: one rank's state to a joiner over the network
    save: float  #: one checkpoint, training blocked (sync persist)
    read: float  #: every rank reads the checkpoint back
    restart: float  #: every rank relaunched (the replacement too) up to the rendezvous
    join: float  #: failure to a replacement being ready to join

    @classmethod
    def of(cls, p: ScaleParams, n: int, store: str = "remote", warm: bool = False
           ) -> ScaleCosts:
        """The costs at size ``n``: checkpoints to ``store``; ``warm``: a warm spare
        takes a failed accelerator's place (else a cold start)."""
        if store not in STORES:
            raise ValueError(f"store must be one of {', '.join(STORES)} (got {store!r})")
        state = p.state_gb * GB
        net = p.network_gbps * GB * p.transfer_efficiency
        if store == "memory":  # a copy in a peer's host memory, over the network
            io = state / net
        else:
            io = state / (min(p.storage_gbps, p.storage_total_gbps / n) * GB
                          * p.write_efficiency)
        rendezvous = p.rendezvous_ms * 1e-3 * n
        return cls(n=n, detect=p.detect_seconds, reform=p.reform_seconds + rendezvous,
                   transfer=state / net, save=io, read=io,
                   restart=(p.warm_restart_seconds if warm else p.restart_seconds) + rendezvous,
                   join=p.warm_join_seconds if warm else p.cold_join_seconds)
