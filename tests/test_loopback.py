"""Every listener a run opens is on loopback: ZooKeeper and the Ray run that uses it.

Ray and gloo runs are watched in every conformance cell they host
(tests/conformance/test_conformance.py): each one is sampled from /proc while it runs,
so no run is started here just to list its sockets. What the matrix has no cell for
is a run with the ZooKeeper coordinator, whose server is sampled here.
"""

from __future__ import annotations

import pytest

from tests.sockets import Sampler, assert_loopback
from trainthrough.config import RunConfig
from trainthrough.lab.runner import run_silent


@pytest.mark.usefixtures("ray_session")
def test_zookeeper_run_listens_on_loopback_only(zk_server) -> None:  # noqa: ANN001
    pytest.importorskip("ray")
    cfg = RunConfig(workload="mlr", engine="ray", consistency="async", shards=1, workers=2,
                    strategy="chain-sync", replicas=2, target=0.5, wall_limit=30,
                    coordinator="zookeeper", zookeeper_hosts=zk_server.hosts)
    with Sampler() as s:
        run_silent(cfg)
    assert_loopback(s.seen)
    assert len(s.seen) >= 3  # GCS, raylet, object manager at least
    assert any(pid == zk_server.pid for pid in s.seen.values()), "ZooKeeper not sampled"
