"""Coordination: membership, chain order, failure notification, a small key-value.

Backends: ``LocalCoordinator`` (in-process), ``RayCoordinator`` (a named actor; the
ray engine's default) and ``ZooKeeperCoordinator`` (kazoo, ephemeral sequential
nodes). ``ZooKeeperServer`` starts a real standalone server on 127.0.0.1.
"""

from trainthrough.coord.base import Coordinator, CoordinatorError
from trainthrough.coord.local import LocalCoordinator
from trainthrough.coord.zkserver import ZooKeeperServer, find_zookeeper
from trainthrough.coord.zookeeper import ZooKeeperCoordinator

__all__ = ["Coordinator", "CoordinatorError", "LocalCoordinator", "ZooKeeperCoordinator",
           "ZooKeeperServer", "find_zookeeper"]
