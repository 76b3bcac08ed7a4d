"""Every listener a run opens is on loopback: Ray, the gloo engine, ZooKeeper.

Sockets are sampled from /proc while each run is going, for this process and all
its descendants (Ray's daemons and workers, gloo rank processes, the ZooKeeper JVM).
"""

from __future__ import annotations

import pytest

from tests.sockets import Sampler, is_loopback
from trainthrough.config import RunConfig
from trainthrough.lab.runner import run_silent


def _assert_loopback(seen: dict[str, int]) -> None:
    assert seen, "no listening socket was observed: the sampler is broken"
    outside = {s: pid for s, pid in seen.items() if not is_loopback(s)}
    assert not outside, f"listening beyond loopback: {outside}"


def test_gloo_engine_listens_on_loopback_only() -> None:
    cfg = RunConfig(workload="mlr", engine="dist", paradigm="dp", ranks=3,
                    strategy="rollback", max_iterations=60, eval_every=20,
                    failures=["rank=1@iter=20"], recovery_delay=0.1)
    with Sampler() as s:
        run_silent(cfg)
    _assert_loopback(s.seen)


@pytest.mark.usefixtures("ray_session")
def test_ray_engine_listens_on_loopback_only() -> None:
    pytest.importorskip("ray")
    cfg = RunConfig(workload="mlr", engine="ray", consistency="async", shards=1, workers=2,
                    strategy="chain-sync", replicas=2, target=0.5, wall_limit=30,
                    failures=["shards=0@iter=20"], recovery_delay=0.2)
    with Sampler() as s:
        run_silent(cfg)
    _assert_loopback(s.seen)
    assert len(s.seen) >= 3  # GCS, raylet, object manager at least


@pytest.mark.usefixtures("ray_session")
def test_zookeeper_run_listens_on_loopback_only(zk_server) -> None:  # noqa: ANN001
    pytest.importorskip("ray")
    cfg = RunConfig(workload="mlr", engine="ray", consistency="async", shards=1, workers=2,
                    strategy="chain-sync", replicas=2, target=0.5, wall_limit=30,
                    coordinator="zookeeper", zookeeper_hosts=zk_server.hosts)
    with Sampler() as s:
        run_silent(cfg)
    _assert_loopback(s.seen)
    assert any(pid == zk_server.pid for pid in s.seen.values()), "ZooKeeper not sampled"
