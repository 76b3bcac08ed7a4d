"""Liveness of Ray chains coordinated by ZooKeeper when sessions flap, and the stall watch.

A chain-sync run whose ZooKeeper sessions flapped once ran 96 minutes until a test
timeout killed it: an expired session was taken for a death (every replica of every
shard at once), and a lost notification left the driver waiting for ZooKeeper forever.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from trainthrough.errors import RunStalled

ray = pytest.importorskip("ray")


def test_the_stall_watch_ends_a_run_that_applies_nothing() -> None:
    from trainthrough.engines.ray.driver.stall import StallWatch

    watch = StallWatch(0.0, lambda: [], limit=0.2)
    watch.check({"w0": {"pushes": 5}}, 3)
    time.sleep(0.1)
    watch.check({"w0": {"pushes": 6}}, 4)  # progress: the clock starts again
    time.sleep(0.15)
    watch.check({"w0": {"pushes": 6}}, 4)  # 0.15 s without progress: within the limit
    time.sleep(0.1)
    with pytest.raises(RunStalled, match=r"no update acknowledged for 0 s \(iteration 4, 6"):
        watch.check({"w0": {"pushes": 6}}, 4)


def _chain_registered(hosts: str, stop: threading.Event) -> bool:
    """Wait until some run's shard0 chain has its 3 replicas in ZooKeeper."""
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=hosts, timeout=5.0)
    zk.start(timeout=10)
    try:
        while not stop.is_set():
            for root in zk.get_children("/"):
                path = f"/{root}/chains/shard0"
                if root.startswith("tt-") and zk.exists(path) and len(zk.get_children(path)) >= 3:
                    return True
            time.sleep(0.1)
        return False
    finally:
        zk.stop()
        zk.close()


def _flap(link: Any, server_hosts: str, stop: threading.Event, cuts: list[float]) -> None:
    """Cut every client off the server for twice the 2 s session timeout, twice: the
    first cut starts just before the head's kill (2 s into training) and spans the
    expiry of its session, so the dead head and the live replicas drop out of ZooKeeper
    together."""
    if not _chain_registered(server_hosts, stop):
        return
    time.sleep(1.5)
    for _ in range(2):
        if stop.is_set():
            return
        link.cut()
        try:
            time.sleep(4.0)
        finally:
            link.heal()
        cuts.append(time.perf_counter())
        time.sleep(3.0)


@pytest.mark.usefixtures("ray_session")
def test_flapping_zookeeper_sessions_neither_hang_nor_break_the_chain(tmp_path: Path) -> None:
    """Every replica's session expires twice while the replicas live (and once around
    a real SIGKILL of the head), cut off from the server by a partition: the run ends on its wall limit, the dead head fails
    over once, the live replicas join ZooKeeper again instead of being taken for dead,
    and no acknowledged update is lost."""
    from tests.zk import Partition, require_zookeeper
    from trainthrough.config import RunConfig
    from trainthrough.coord.zkserver import ZooKeeperServer
    from trainthrough.lab.runner import run

    require_zookeeper("the session-flapping test")
    with ZooKeeperServer() as server, Partition(server.hosts) as link:
        cfg = RunConfig(workload="mlr", strategy="chain-sync", engine="ray", shards=1,
                        workers=2, consistency="async", eval_every=5, stop_at_target=False,
                        wall_limit=16.0, failures=["shards=0@time=2s"], replicas=3,
                        coordinator="zookeeper", zookeeper_hosts=link.hosts)
        stop = threading.Event()
        cuts: list[float] = []
        flapper = threading.Thread(target=_flap, args=(link, server.hosts, stop, cuts),
                                   daemon=True)
        flapper.start()
        t0 = time.perf_counter()
        try:
            s = run(cfg, tmp_path / "run").result
        finally:
            stop.set()
            flapper.join(timeout=15)
        took = time.perf_counter() - t0
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    kinds = [e["type"] for e in events]
    assert len(cuts) == 2, "the clients were not cut off twice during the run"
    # The flap happened (else this test tests nothing) and was taken for one.
    assert "zookeeper-absent" in kinds and "zookeeper-rejoined" in kinds
    assert "down" not in kinds  # before: every replica "died", the shard restarted
    assert s.failures == 1 and [r.action for r in s.recoveries] == ["failover"]
    assert s.extras["acknowledged_lost"] == 0
    # 16 s of training, start-up and shutdown; before the fix it never ended.
    assert took < 90, f"took {took:.0f} s"
