"""The coordinator interface: who is alive in each replica chain, and a few small values.

A *chain* (one per parameter-server shard, e.g. ``"shard0"``) is an ordered list of
live replicas. Order is join order: the lowest sequence number is the head, new
members join at the tail, and a member that leaves or dies simply drops out, so its
successor takes its place (the head's successor becomes the head). This is the
scheme of Training Through Failure (each replica watches its predecessor) and of
the ZooKeeper leader-election recipe.

Membership is tied to the session of the coordinator that joined it: if the process
holding the session dies, its members vanish once the session times out. That is
how failures are *detected*; what to do about them is decided elsewhere (``ft/``).
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import Any

# Chain and member names become znode path segments or znode data; keep them plain so
# no backend has to escape anything.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,127}")
# ZooKeeper refuses znodes larger than ~1 MB (jute.maxbuffer); both backends enforce the
# same limit so a value that works in tests works in production.
MAX_VALUE_BYTES = 1_000_000

log = logging.getLogger(__name__)
MembersCallback = Callable[[list[str]], None]
PredecessorCallback = Callable[[str | None], None]


class CoordinatorError(RuntimeError):
    """The coordination service cannot serve the call (connection lost, closed).

    Takes a single message argument so it pickles across processes.
    """


class Coordinator(ABC):
    """Membership of replica chains, failure notification, and a small key-value store.

    Call order:

    1. construct (connects; a backend that cannot reach its service raises
       :class:`~trainthrough.errors.UserError` naming what to fix);
    2. :meth:`join` once per replica this process hosts, in the order they should
       sit in the chain;
    3. :meth:`watch` (observers such as the engine) and/or
       :meth:`watch_predecessor` (a replica learning it became head) — each calls
       back once immediately with the current state, then on every change;
    4. at any time: :meth:`members`, :meth:`head`, :meth:`tail`,
       :meth:`member_data`, :meth:`put`, :meth:`get`;
    5. :meth:`leave` for a clean departure (a crash needs no call: the session
       expires);
    6. :meth:`close` (also on ``with`` exit): members joined here leave, watches stop.

    Callbacks run on a coordinator thread (or the mutating thread for the local
    backend), one at a time and in order; they must return quickly and must not
    wait for other threads that use the coordinator.
    """

    @abstractmethod
    def join(self, chain: str, member: str, data: bytes = b"") -> str:
        """Register a live member at the tail of ``chain``.

        Args:
            chain: chain name, e.g. ``"shard0"``.
            member: member name, unique among the chain's live members. A restarted
                replica should use a fresh name (e.g. ``"r1@2"``): its dead
                predecessor incarnation may linger until its session expires.
            data: small payload readable by others via :meth:`member_data`
                (e.g. an actor address).

        Returns:
            The member's sequence id, e.g. ``"m-0000000003"``; ids grow with join order.

        Raises:
            ValueError: bad name, duplicate live member, or ``data`` too large.
            CoordinatorError: the service is unavailable or the coordinator is closed.
        """

    @abstractmethod
    def leave(self, chain: str, member: str) -> None:
        """Remove a member this coordinator joined; watchers see the shorter chain.

        Raises:
            KeyError: ``member`` is not a live member joined through this coordinator.
            CoordinatorError: the service is unavailable or the coordinator is closed.
        """

    @abstractmethod
    def members(self, chain: str) -> list[str]:
        """Return the live members of ``chain`` in chain order (head first); ``[]`` if none."""

    @abstractmethod
    def member_data(self, chain: str, member: str) -> bytes | None:
        """Return the ``data`` a live member joined with, or ``None`` if it is not live."""

    @abstractmethod
    def watch(self, chain: str, callback: MembersCallback) -> None:
        """Call ``callback(members)`` now and whenever the chain's membership changes.

        Consecutive calls never repeat the same list. Watches last until :meth:`close`.
        """

    @abstractmethod
    def watch_predecessor(self, chain: str, member: str, callback: PredecessorCallback) -> None:
        """Call ``callback(predecessor)`` now and whenever ``member``'s predecessor changes.

        ``None`` means ``member`` is the head. Since new members join at the tail,
        the predecessor changes only when it leaves or dies, so only the successor of
        a failed member is woken (no herd effect). Stops when ``member`` leaves.

        Raises:
            KeyError: ``member`` is not a live member joined through this coordinator.
        """

    @abstractmethod
    def put(self, key: str, value: bytes) -> None:
        """Store a small value (e.g. ``"shard0/latest"`` -> ``b"ckpt-00000230"``); it persists
        after the writer's session ends.

        Raises:
            ValueError: bad key or value too large.
            TypeError: ``value`` is not bytes.
        """

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """Return the value stored under ``key``, or ``None`` if there is none."""

    @abstractmethod
    def close(self) -> None:
        """Leave every member joined here and stop watches. Idempotent."""

    # Derived queries: one definition for every backend, built on members().
    def head(self, chain: str) -> str | None:
        """Return the head of ``chain`` (lowest live sequence id), or ``None`` if empty."""
        live = self.members(chain)
        return live[0] if live else None

    def tail(self, chain: str) -> str | None:
        """Return the tail of ``chain`` (the member that joined last), or ``None``."""
        live = self.members(chain)
        return live[-1] if live else None

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a valid chain or member name, else raise ``ValueError``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"{kind} name {name!r} is invalid: use 1-128 letters, digits or '_.@:-', "
            "starting with a letter or digit"
        )
    return name


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid ``/``-separated key (e.g. ``"shard0/latest"``)."""
    if not isinstance(key, str) or not key or not all(_NAME.fullmatch(p) for p in key.split("/")):
        raise ValueError(
            f"key {key!r} is invalid: use '/'-separated parts of letters, digits or '_.@:-'"
        )
    return key


def check_value(what: str, value: bytes) -> bytes:
    """Return ``value`` as bytes if it is bytes-like and small enough."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(f"{what} is {len(value)} bytes; the limit is {MAX_VALUE_BYTES}")
    return value


def changes_only(callback: Callable[[Any], None], what: str) -> Callable[[Any], None]:
    """Wrap a watch callback so it never sees the same value twice in a row.

    Callback exceptions are logged, not raised: the caller is a coordinator thread (or
    whoever changed the chain), and one broken observer must not silence the others.
    The wrapper is not thread-safe; backends call it from one thread at a time.
    """
    last: list[Any] = []

    def deliver(value: Any) -> None:
        if last and last[0] == value:
            return
        last[:] = [value]
        try:
            callback(value)
        except Exception:
            log.exception("coordinator callback for %s failed", what)

    return deliver
