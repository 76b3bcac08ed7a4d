"""The ``sim`` engine: in-process, deterministic, on a virtual clock.

Declares what it runs (see :mod:`trainthrough.engines.capabilities`).
"""

from trainthrough.engines.capabilities import Traits, caps

DESCRIPTION = "in-process, deterministic, virtual clock (the failure simulation framework)"
ENGINE = "trainthrough.engines.sim.factory:build"
TRAITS = Traits(virtual_clock=True, hosts_processes=False)
_TRIGGERS = ("iter", "time", "mtbf")
CAPABILITIES = {
    "ps": caps(consistency=("bsp", "ssp"), checkpoint=("none", "full", "prioritized"),
               persist=("sync", "async"),
               recovery=("reinit", "rollback-all", "restore-lost", "worker-copy"),
               replication=("none",), outage=("wait",), targets=("shard", "worker"),
               triggers=_TRIGGERS, phases=("", "recovery"), resume=True,
               options=("shards", "workers")),
    "dp": caps(consistency=("bsp",), checkpoint=("none", "full"), persist=("sync", "async"),
               recovery=("rollback-all", "mini-batch-rollback", "lossy-forward", "drop-local"),
               replication=("none",), outage=("wait",), targets=("rank",), triggers=_TRIGGERS,
               phases=("", "forward", "backward", "allreduce", "update", "inner", "outer",
                       "recovery"),
               # pause, slow, preempt, partition: on the virtual clock
               # (engines/sim/dp_kinds.py)
               modes=("crash", "hang", "pause", "slow", "preempt", "partition"), resume=True,
               options=("ranks", "elastic", "allreduce_buckets", "micro_batches", "replace",
                        "straggler_deadline"),
               sync=("every-step", "localsgd", "diloco", "streaming-diloco")),
}
