"""The embedded ``ray`` coordinator: a named registry actor plus Ray's death notices.

Membership lives in one named actor (so workers on any node can find it by name);
a member is removed when the engine sees its actor die (a pending ``watch`` call
fails with ``ActorDiedError`` the moment the process is gone), which plays the part
of ZooKeeper's ephemeral nodes. Watch callbacks run in the process that registered
them (the engine's driver), fired by :meth:`RayCoordinator.leave` / ``join``.
"""

from __future__ import annotations

import threading
from typing import Any

import ray

from trainthrough.coord.base import Coordinator, MembersCallback, PredecessorCallback


@ray.remote(num_cpus=0, max_concurrency=4)  # type: ignore[call-overload]
class Registry:
    """Chains (ordered member names), an epoch per chain, and a small key-value."""

    def __init__(self) -> None:
        self.chains: dict[str, list[str]] = {}
        self.epochs: dict[str, int] = {}
        self.kv: dict[str, bytes] = {}
        self.seq = 0

    def join(self, chain: str, member: str) -> str:
        self.seq += 1
        self.chains.setdefault(chain, []).append(member)
        self.epochs[chain] = self.epochs.get(chain, 0) + 1
        return f"{self.seq:010d}"

    def leave(self, chain: str, member: str) -> None:
        if member in self.chains.get(chain, []):
            self.chains[chain].remove(member)
            self.epochs[chain] = self.epochs.get(chain, 0) + 1

    def members(self, chain: str) -> tuple[int, list[str]]:
        return self.epochs.get(chain, 0), list(self.chains.get(chain, []))

    def reset(self) -> None:
        """Empty, as new: a pooled registry serves its next run (engines/ray/driver/pool.py)."""
        self.__init__()  # type: ignore[misc]

    def release(self) -> bool:
        return True

    def put(self, key: str, value: bytes) -> None:
        self.kv[key] = value

    def get(self, key: str) -> bytes | None:
        return self.kv.get(key)


class RayCoordinator(Coordinator):
    """Coordinator backed by a named :class:`Registry` actor."""

    def __init__(self, name: str, create: bool = True, handle: Any = None,
                 options: dict[str, Any] | None = None) -> None:
        """``handle``: an existing (empty) registry named ``name`` to use; ``options``:
        more Ray actor options for a new one."""
        self.name = name
        self.registry = handle if handle is not None else (
            Registry.options(  # type: ignore[attr-defined]
                name=name, get_if_exists=True, **(options or {})).remote()
            if create else ray.get_actor(name))
        self._watches: dict[str, list[MembersCallback]] = {}
        self._lock = threading.Lock()

    def _fire(self, chain: str) -> None:
        members = self.members(chain)
        for cb in list(self._watches.get(chain, [])):
            cb(members)

    def join(self, chain: str, member: str, data: bytes = b"") -> str:
        seq = ray.get(self.registry.join.remote(chain, member))
        self._fire(chain)
        return str(seq)

    def leave(self, chain: str, member: str) -> None:
        ray.get(self.registry.leave.remote(chain, member))
        self._fire(chain)

    def members(self, chain: str) -> list[str]:
        return list(ray.get(self.registry.members.remote(chain))[1])

    def member_data(self, chain: str, member: str) -> bytes | None:
        return b"" if member in self.members(chain) else None

    def watch(self, chain: str, callback: MembersCallback) -> None:
        with self._lock:
            self._watches.setdefault(chain, []).append(callback)

    def watch_predecessor(self, chain: str, member: str, callback: PredecessorCallback) -> None:
        def on_change(members: list[str]) -> None:
            if member in members:
                i = members.index(member)
                callback(members[i - 1] if i > 0 else None)  # type: ignore[arg-type]

        self.watch(chain, on_change)

    def put(self, key: str, value: bytes) -> None:
        ray.get(self.registry.put.remote(key, value))

    def get(self, key: str) -> bytes | None:
        return ray.get(self.registry.get.remote(key))

    def close(self) -> None:
        self._watches.clear()

    def handle(self) -> Any:
        return self.registry
