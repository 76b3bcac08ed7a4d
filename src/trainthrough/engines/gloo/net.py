"""Which address the controller's store listens on and which interface each rank's gloo uses.

The rule (README, "Trust"): a run on one machine listens on 127.0.0.1 only; a run that
joins a cluster listens on the cluster's addresses, because its ranks are on other
machines; a user who names an address (``--bind-address``) or an interface
(``GLOO_SOCKET_IFNAME``) gets that. Never every interface (0.0.0.0): ``TCPStore`` would
open one, so :func:`~.protocol.serve` binds the socket itself.

The controller decides the store's host (:func:`store_host`) and writes, in every rank's
spec under ``net``, what a rank needs to choose its interface: ``bind`` (the user's
``--bind-address``), ``ifname`` (the controller's ``GLOO_SOCKET_IFNAME``, if the user set
one), ``cluster`` and ``node_ip`` (on a cluster, the rank's own node address, filled in
where it runs: a Ray actor knows its node's Ray address). The rank then calls
:func:`gloo_interface` before it forms any group.

Linux, IPv4: an interface's addresses are read with ``SIOCGIFADDR`` (stdlib ``fcntl``),
which reports one IPv4 address per interface (the first; an alias label such as
``eth0:1`` is its own entry).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from typing import Any

LOOPBACK = "127.0.0.1"
IFNAME_ENV = "GLOO_SOCKET_IFNAME"
_SIOCGIFADDR = 0x8915


def interface_addresses() -> dict[str, str]:
    """Interface name -> its IPv4 address, for every interface of this host that has one."""
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address (or down without one)
                continue
            out[name] = socket.inet_ntoa(raw[20:24])
    return out


def interface_of(ip: str) -> str | None:
    """The interface of this host that holds ``ip`` (any 127.x is ``lo``), or None."""
    if ip.startswith("127."):
        return "lo"
    return next((name for name, addr in interface_addresses().items() if addr == ip), None)


def store_host(bind_address: str | None, cluster_ip: str | None) -> str:
    """Where the controller's store listens: the user's address, else the driver's
    address on the cluster it joined (``cluster_ip``), else loopback."""
    return bind_address or cluster_ip or LOOPBACK


def rank_net(bind_address: str | None, cluster: bool) -> dict[str, Any]:
    """What the controller writes into every rank's spec (``net``); ``cluster``: the
    ranks run on the nodes of a cluster (each fills in ``node_ip`` where it runs)."""
    return {"bind": bind_address, "ifname": os.environ.get(IFNAME_ENV) or None,
            "cluster": cluster, "node_ip": None}


def gloo_interface(net: dict[str, Any] | None, own_env: str | None) -> str:
    """The interface this rank's gloo binds to, in order of precedence:

    1. ``GLOO_SOCKET_IFNAME`` as the user set it where this rank runs (``own_env``),
       else as set on the controller's machine (``net["ifname"]``);
    2. the interface holding the user's ``--bind-address``, if this host holds it;
    3. the interface holding this rank's node address (a rank on a cluster);
    4. ``lo`` (a local run).

    Raises:
        RuntimeError: the node address is on no interface of this host (a rank
            cannot choose an address its peers reach).
    """
    net = net or {}
    chosen = own_env or net.get("ifname")
    if chosen:
        return str(chosen)
    if net.get("bind"):
        named = interface_of(str(net["bind"]))
        if named is not None:
            return named
    node_ip = net.get("node_ip")
    if node_ip:
        found = interface_of(str(node_ip))
        if found is None:
            raise RuntimeError(f"this rank's node address {node_ip} is on none of this "
                               f"host's interfaces {interface_addresses()}; set "
                               f"{IFNAME_ENV} where the node runs")
        return found
    return "lo"
