"""In-process coordinator: the single-process twin of the ZooKeeper one.

Used by the ``sim`` engine and by tests. Every member lives in this one object, so
"the session dies" is simulated by :meth:`LocalCoordinator.expire`. Notifications
are delivered synchronously on the thread that changed the membership, which keeps
``sim`` runs deterministic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainthrough.coord.base import (
    Coordinator,
    CoordinatorError,
    MembersCallback,
    PredecessorCallback,
    changes_only,
    check_key,
    check_name,
    check_value,
)


@dataclass(eq=False)
class _Watch:
    deliver: Callable[[Any], None]  # wrapped by changes_only
    member: str | None = None  # set for predecessor watches


class LocalCoordinator(Coordinator):
    """Thread-safe, in-memory :class:`Coordinator` with sequence ids like ZooKeeper's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the state below
        # Delivery is serialized separately so callbacks run without holding _lock
        # (a callback may call back into the coordinator); reentrant for that reason.
        self._deliver = threading.RLock()
        self._chains: dict[str, dict[str, tuple[int, bytes]]] = {}  # member -> (seq, data)
        self._next_seq: dict[str, int] = {}
        self._kv: dict[str, bytes] = {}
        self._watches: dict[str, list[_Watch]] = {}
        self._closed = False

    # -- membership ---------------------------------------------------------------
    def join(self, chain: str, member: str, data: bytes = b"") -> str:
        check_name("chain", chain)
        check_name("member", member)
        data = check_value("member data", data)
        with self._lock:
            self._check_open()
            live = self._chains.setdefault(chain, {})
            if member in live:
                raise ValueError(f"member {member!r} is already live in chain {chain!r}")
            # Sequence numbers never repeat within a chain (as ZooKeeper's parent
            # cversion), so dict insertion order is chain order.
            seq = self._next_seq.get(chain, 0)
            self._next_seq[chain] = seq + 1
            live[member] = (seq, data)
        self._notify(chain)
        return f"m-{seq:010d}"

    def leave(self, chain: str, member: str) -> None:
        self._remove(chain, member)

    def expire(self, chain: str, member: str) -> None:
        """Simulate the loss of the session holding ``member`` (a crash).

        Raises:
            KeyError: ``member`` is not live in ``chain``.
        """
        self._remove(chain, member)

    def _remove(self, chain: str, member: str) -> None:
        with self._lock:
            self._check_open()
            live = self._chains.get(chain, {})
            if member not in live:
                raise KeyError(f"{member!r} is not a live member of chain {chain!r}")
            del live[member]
        self._notify(chain)

    def members(self, chain: str) -> list[str]:
        with self._lock:
            self._check_open()
            return list(self._chains.get(chain, {}))

    def member_data(self, chain: str, member: str) -> bytes | None:
        with self._lock:
            self._check_open()
            entry = self._chains.get(chain, {}).get(member)
            return entry[1] if entry else None

    # -- notification -------------------------------------------------------------
    def watch(self, chain: str, callback: MembersCallback) -> None:
        check_name("chain", chain)
        self._add_watch(chain, _Watch(changes_only(callback, f"chain {chain!r}")))

    def watch_predecessor(self, chain: str, member: str, callback: PredecessorCallback) -> None:
        with self._lock:
            if member not in self._chains.get(chain, {}):
                raise KeyError(f"{member!r} is not a live member of chain {chain!r}")
        self._add_watch(chain, _Watch(changes_only(callback, f"{member!r}"), member=member))

    def _add_watch(self, chain: str, watch: _Watch) -> None:
        with self._lock:
            self._check_open()
            self._watches.setdefault(chain, []).append(watch)
        self._notify(chain)  # the initial call; other watches see no change and stay quiet

    def _notify(self, chain: str) -> None:
        # Each watch gets the state as it is *at delivery*, never a snapshot taken
        # earlier, and changes_only drops repeats. So concurrent or nested changes may
        # merge notifications but never deliver them out of order.
        with self._deliver:
            with self._lock:
                watches = list(self._watches.get(chain, []))
            for w in watches:
                with self._lock:
                    order = list(self._chains.get(chain, {}))
                    if w.member is not None and w.member not in order:
                        if w in self._watches.get(chain, []):
                            self._watches[chain].remove(w)  # its member left: the watch ends
                        continue
                if w.member is None:
                    w.deliver(order)
                else:
                    i = order.index(w.member)
                    w.deliver(order[i - 1] if i else None)

    # -- key-value ----------------------------------------------------------------
    def put(self, key: str, value: bytes) -> None:
        check_key(key)
        value = check_value("value", value)
        with self._lock:
            self._check_open()
            self._kv[key] = value

    def get(self, key: str) -> bytes | None:
        check_key(key)
        with self._lock:
            self._check_open()
            return self._kv.get(key)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._chains.clear()
            self._watches.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise CoordinatorError("the coordinator is closed")
