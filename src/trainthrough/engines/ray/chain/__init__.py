"""Chain replication of a shard's replicas.

Inside each replica: :mod:`.chain_link` orders, forwards and acknowledges pushes;
:mod:`.forward` sends a forward to the successor, over the link's own socket
(:mod:`.link_socket`, frames built by :mod:`.wire`) or as a Ray call. On the driver:
:mod:`.zk_membership`, the chains' membership as ZooKeeper reports it. Which replicas
form a chain, and how it is rewired when one dies, is :mod:`trainthrough.ft.chain`.
Importing this package imports nothing.
"""
