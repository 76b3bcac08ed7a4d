"""The ``ray`` engine: shards, replicas and workers as Ray actors, failures as SIGKILL.

Its parts:

* :mod:`.driver`: the driver process (the engine's loop, the run's actors and their
  life cycle, recovery, bulk-synchronous rounds, checkpoints, actor pools, and data
  parallel with ranks on Ray nodes);
* :mod:`.actors`: what runs inside the actor processes (shards, workers, the hosts of
  data-parallel ranks);
* :mod:`.chain`: chain replication of a shard (the link in each replica, its
  transport, the driver's view of ZooKeeper membership);
* :mod:`.runtime`: starting and joining Ray.

Ray reads some settings when it is imported, so the loopback settings go into the
environment here, before any submodule imports ray (runtime.py says why). This module
also declares what the engine runs (``ENGINE``: import paths of the engine classes);
importing it does not import Ray.
"""

import os
from dataclasses import replace

from trainthrough.engines.capabilities import Traits, caps
from trainthrough.engines.gloo import CAPABILITIES as GLOO_CAPABILITIES

# Loopback listeners, no usage reporting, every log line kept (runtime.py sets them
# again before starting Ray, for callers that imported Ray first).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_DEDUP_LOGS": "0"}
#: The Ray namespace of every driver that joins a cluster (driver/warm.py: actors kept warm).
NAMESPACE = "trainthrough"
for _k, _v in LOOPBACK_ENV.items():
    os.environ.setdefault(_k, _v)

DESCRIPTION = "shards, replicas and workers as Ray actors; failures are real SIGKILLs"
# The parameter server is Ray's own engine; data parallel is the gloo engine's
# controller with every rank a process of its node's host actor (driver/dp.py), so it runs what gloo runs.
ENGINE = {"ps": "trainthrough.engines.ray.driver.engine:RayEngine",
          "dp": "trainthrough.engines.ray.driver.dp:RayDataParallel"}
TRAITS = Traits(on_ray=True)
CAPABILITIES = {
    # Workers run asynchronously, each at its own pace. Saves and restores are the
    # shared ShardCheckpoint (full and prioritized) inside each shard's actor; a
    # rollback of everything rewinds the workers to the checkpoint's step. Every death
    # starts its own replacement at once (driver/recovery.py: one pending entry each), so
    # failures striking during a recovery recover side by side with it; in
    # bulk-synchronous rounds a failure due during a recovery strikes only after it
    # (driver/bsp.py _settle delivers phase=recovery failures alone), together with any other
    # held back, and those recover side by side.
    "ps": caps(consistency=("bsp", "async"), checkpoint=("none", "full", "prioritized"),
               persist=("sync", "async"),
               recovery=("reinit", "rollback-all", "restore-lost", "failover", "worker-copy"),
               replication=("none", "chain-sync", "chain-async"), outage=("wait", "buffer"),
               targets=("shard", "worker", "replica"), triggers=("iter", "time", "mtbf"),
               phases=("",), replica_position=True, parallel_recovery=("async",),
               batched_recovery=("bsp",),
               options=("shards", "workers", "ray_address", "recovery_delay", "coordinator",
                        "zookeeper_hosts", "wall_limit")),
    # Data parallel is the gloo engine's controller with ranks on actors: its claims,
    # and the cluster to join.
    # Not (yet) a pause or a slow rank, nor the straggler deadline: continuing a paused
    # actor on another node is not this driver's to signal, and none of them is in
    # Ray's conformance cells. Not a preemption's notice (mode=preempt): an actor's
    # SIGTERM is Ray's own (it ends the worker), so its ranks take no notice
    # (driver/dp.py takes_notice).
    "dp": replace(GLOO_CAPABILITIES["dp"],
                  modes=frozenset({"crash", "hang"}),
                  options=(GLOO_CAPABILITIES["dp"].options - {"straggler_deadline"})
                  | {"ray_address", "checkpoint_shared"}),
}


def refuse(consistency: str, strategy: object) -> list[tuple[str, str]]:
    """What this engine refuses beyond single values: chains and the stateless outage
    need workers running at their own pace (bulk-synchronous rounds have no pushes to
    forward or buffer)."""
    if consistency == "bsp":
        return [(m, getattr(strategy, m)) for m, off in (("replication", "none"),
                                                          ("outage", "wait"))
                if getattr(strategy, m) != off]
    return []
