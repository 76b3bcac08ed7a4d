"""Which address a data-parallel run listens on (engines/gloo/net.py) and the checks on
``--bind-address`` and on checkpoints a cluster's hosts must all reach (issue 26).

In-process and quick: the listening itself is checked by the conformance cells (a local
run: loopback only) and the two-host test (a cluster: each host's own address).
"""

from __future__ import annotations

import pytest

from trainthrough.config import RunConfig
from trainthrough.engines.gloo.net import (
    LOOPBACK,
    gloo_interface,
    interface_addresses,
    interface_of,
    rank_net,
    store_host,
)
from trainthrough.errors import UserError
from trainthrough.lab.validate import validate_run


def test_a_local_run_listens_on_loopback_and_a_cluster_run_on_its_address() -> None:
    assert store_host(None, None) == LOOPBACK
    assert store_host(None, "10.1.2.3") == "10.1.2.3"  # the driver's Ray address
    assert store_host("10.9.9.9", "10.1.2.3") == "10.9.9.9"  # the user's word wins
    # A local rank: loopback, whatever the machine's other interfaces.
    assert gloo_interface(rank_net(None, cluster=False), None) == "lo"


def test_a_rank_on_a_cluster_binds_the_interface_holding_its_node_address() -> None:
    name, ip = next(iter(interface_addresses().items()))  # a real interface of this host
    net = {**rank_net(None, cluster=True), "node_ip": ip}
    assert gloo_interface(net, None) == name
    assert interface_of("127.0.0.3") == "lo"  # nodes on loopback addresses: one host
    with pytest.raises(RuntimeError, match="192.0.2.254 is on none of this host"):
        gloo_interface({**net, "node_ip": "192.0.2.254", "ifname": None}, None)


def test_a_user_set_interface_or_address_is_honoured() -> None:
    net = {**rank_net(None, cluster=True), "node_ip": "127.0.0.3"}
    assert gloo_interface({**net, "ifname": "eth7"}, None) == "eth7"  # the driver's setting
    assert gloo_interface({**net, "ifname": "eth7"}, "ib0") == "ib0"  # this host's own
    assert gloo_interface({**net, "bind": "127.0.0.1"}, None) == "lo"
    # A bind address another host holds does not apply here: the node's address does.
    assert gloo_interface({**net, "bind": "192.0.2.254"}, None) == "lo"


def _dp(**kw: object) -> RunConfig:
    return RunConfig(**{"paradigm": "dp", "strategy": "rollback", **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "says"), [
    ("host", "is not an IPv4 address"),
    ("0.0.0.0", "never done"),
    ("224.0.0.1", "name one address of this machine"),
    ("192.0.2.254", "is not an address of this machine"),
])
def test_bind_address_is_one_address_of_this_machine(value: str, says: str) -> None:
    with pytest.raises(UserError, match=says):
        _dp(engine="gloo", bind_address=value).validate()
    _dp(engine="gloo", bind_address="127.0.0.1").validate()


def test_bind_address_is_refused_where_nothing_reads_it() -> None:
    with pytest.raises(UserError, match="bind-address"):
        validate_run(RunConfig(engine="ray", bind_address="127.0.0.1"))  # parameter server


def test_checkpoint_restart_on_a_cluster_needs_storage_every_host_reaches() -> None:
    on_cluster = _dp(engine="ray", ray_address="10.0.0.1:6379", strategy="checkpoint-restart")
    for where in (None, "ckpt", "/data/ckpt", "file:///data/ckpt", "memory://ckpt"):
        cfg = RunConfig.from_dict({**on_cluster.to_dict(), "checkpoint_dir": where}
                                  if where else on_cluster.to_dict())
        with pytest.raises(UserError, match="--checkpoint-shared") as e:
            validate_run(cfg)
        assert "\n" not in str(e.value)
    # A folder the user declares shared is taken at their word.
    validate_run(RunConfig.from_dict({**on_cluster.to_dict(), "checkpoint_dir": "/nfs/ckpt",
                                      "checkpoint_shared": True}))
    # Rollback never restores from a checkpoint; one machine reaches its own disk.
    validate_run(_dp(engine="ray", ray_address="10.0.0.1:6379"))
    validate_run(_dp(engine="gloo", strategy="checkpoint-restart"))


def test_checkpoint_shared_needs_a_cluster_and_a_folder() -> None:
    with pytest.raises(UserError, match="needs --ray-address and --checkpoint-dir"):
        _dp(engine="ray", checkpoint_dir="/nfs/x", checkpoint_shared=True).validate()
    with pytest.raises(UserError, match="checkpoint-shared"):  # the parameter server
        validate_run(RunConfig(engine="ray", ray_address="10.0.0.1:6379",
                               checkpoint_dir="/nfs/x", checkpoint_shared=True))
