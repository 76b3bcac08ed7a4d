"""ZooKeeper coordinator (through kazoo): membership that survives real process deaths.

Layout under the namespace (default ``/trainthrough``):

- ``chains/<chain>/m-<10-digit seq>`` — one EPHEMERAL SEQUENTIAL znode per live
  member; its data is ``member name + NUL + member data``. ZooKeeper deletes it when
  the owning session ends (cleanly at once, after a crash once the session times out),
  and its sequence number gives the chain order.
- ``kv/<key>`` — persistent znodes holding the values of :meth:`put`.

Two kinds of watches, as in Training Through Failure: a replica watches only its
predecessor's znode (:meth:`watch_predecessor`, an ``exists`` watch, so a failure
wakes one successor, not the whole chain); observers such as the engine put a
children watch on the chain (:meth:`watch`, kazoo ``ChildrenWatch``).

Values are raw bytes; nothing read from ZooKeeper is ever unpickled.
"""

from __future__ import annotations

import contextlib
import logging
import threading
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
from trainthrough.errors import UserError

try:
    from kazoo.client import KazooClient, KazooState
    from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError
    from kazoo.recipe.watchers import ChildrenWatch
except ImportError:  # the `zookeeper` extra is optional; __init__ says how to get it
    KazooClient = None

log = logging.getLogger(__name__)


class ZooKeeperCoordinator(Coordinator):
    """:class:`Coordinator` backed by a ZooKeeper ensemble; one ZooKeeper session per instance.

    Args:
        hosts: kazoo connection string, e.g. ``"127.0.0.1:2181"`` or ``"a:2181,b:2181"``.
        namespace: root znode for everything this coordinator writes.
        session_timeout: seconds after which a crashed member's znodes vanish (the
            server clamps it to [2, 20] x its tickTime).
        connect_timeout: seconds to wait for the first connection, and for any call.

    Raises:
        UserError: kazoo is missing, the arguments are malformed, or no server answered
            within ``connect_timeout``.
    """

    def __init__(
        self,
        hosts: str,
        namespace: str = "/trainthrough",
        session_timeout: float = 2.0,
        connect_timeout: float = 5.0,
    ) -> None:
        if KazooClient is None:
            raise UserError("ZooKeeperCoordinator needs kazoo: pip install 'trainthrough[zookeeper]'")
        try:
            check_key(namespace[1:] if namespace.startswith("/") else "")
        except ValueError:
            raise UserError(f"namespace {namespace!r} must be a path like '/trainthrough'") from None
        self._hosts, self._root, self._timeout = hosts, namespace, connect_timeout
        self._lock = threading.Lock()
        self._mine: dict[tuple[str, str], str] = {}  # (chain, member) -> znode name, joined here
        self._names: dict[tuple[str, str], tuple[str, bytes]] = {}  # znode -> (member, data)
        self._closed = False
        try:
            self._client = KazooClient(
                hosts=hosts,
                timeout=session_timeout,
                # Reconnect quickly and forever: a short outage must not end the session.
                connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0},
                command_retry={"max_tries": 3, "delay": 0.1, "max_delay": 1.0},
            )
            self._client.start(timeout=connect_timeout)
        except ValueError as exc:
            self._stop_quietly()
            raise UserError(f"ZooKeeper hosts {hosts!r}: {exc}; use 'host:port[,...]'") from None
        except Exception as exc:  # kazoo's timeout error type depends on the handler
            self._stop_quietly()  # else its connection thread retries forever, unowned
            raise UserError(
                f"no ZooKeeper server answered at {hosts!r} within {connect_timeout:g} s ({exc}); "
                "start one (e.g. trainthrough.coord.zkserver.ZooKeeperServer) or fix the address"
            ) from None
        self._client.add_listener(self._on_state)

    def _stop_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self._client.stop()
            self._client.close()

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: only bookkeeping here. A LOST session has
        # already deleted our ephemeral znodes, exactly as if this process had crashed.
        if state == KazooState.LOST:
            with self._lock:
                if self._mine and not self._closed:
                    log.warning("ZooKeeper session lost; members %s are gone", sorted(self._mine))
                self._mine.clear()

    # -- helpers --------------------------------------------------------------------
    def _path(self, chain: str, znode: str = "") -> str:
        return f"{self._root}/chains/{check_name('chain', chain)}" + (f"/{znode}" if znode else "")

    def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a kazoo ``*_async`` call with a bounded wait (never leave the caller blocked)."""
        if self._closed:
            raise CoordinatorError("the coordinator is closed")
        try:
            return method(*args, **kwargs).get(timeout=self._timeout)
        except (ConnectionLoss, SessionExpiredError, self._client.handler.timeout_exception) as exc:
            raise CoordinatorError(f"ZooKeeper at {self._hosts} failed {what} ({type(exc).__name__}, "
                                   f"waited at most {self._timeout:g} s)") from None

    def _ordered(self, chain: str, znodes: list[str] | None = None) -> list[tuple[str, str, bytes]]:
        """(znode, member, data) of ``chain`` in sequence order; cached, as znodes never change."""
        if znodes is None:
            try:
                znodes = self._call("list", self._client.get_children_async, self._path(chain))
            except NoNodeError:
                return []
        out = []
        for z in sorted(znodes, key=lambda z: z.rsplit("-", 1)[-1]):
            with self._lock:
                entry = self._names.get((chain, z))
            if entry is None:
                try:
                    raw, _ = self._call("read", self._client.get_async, self._path(chain, z))
                except NoNodeError:
                    continue  # gone between listing and reading
                name, _, data = raw.partition(b"\0")
                entry = (name.decode(), data)
                with self._lock:
                    self._names[(chain, z)] = entry
            out.append((z, *entry))
        with self._lock:  # forget departed znodes; kazoo's callback thread runs this too
            for key in [k for k in self._names if k[0] == chain and k[1] not in znodes]:
                del self._names[key]
        return out

    # -- membership -----------------------------------------------------------------
    def join(self, chain: str, member: str, data: bytes = b"") -> str:
        check_name("member", member)
        payload = member.encode() + b"\0" + check_value("member data", data)
        # Best effort across processes: one engine names the replicas, so a clash here
        # is a bug (or a restarted replica reusing the name of one not yet expired).
        if member in self.members(chain):
            raise ValueError(f"member {member!r} is already live in chain {chain!r}")
        path = self._call("join", self._client.create_async, self._path(chain, "m-"), payload,
                          ephemeral=True, sequence=True, makepath=True)
        znode = path.rsplit("/", 1)[1]
        with self._lock:
            self._mine[(chain, member)] = znode
            self._names[(chain, znode)] = (member, bytes(data))
        return znode

    def leave(self, chain: str, member: str) -> None:
        with self._lock:
            znode = self._mine.pop((chain, member), None)
        if znode is None:
            raise KeyError(f"{member!r} was not joined to chain {chain!r} through this coordinator")
        with contextlib.suppress(NoNodeError):  # an expired session already deleted it
            self._call("leave", self._client.delete_async, self._path(chain, znode))

    def joined(self, chain: str, member: str) -> bool:
        """Whether ``member`` joined through this coordinator and its session lives on
        (a session that expired deleted the znode: the member must join again)."""
        with self._lock:
            return (chain, member) in self._mine

    def members(self, chain: str) -> list[str]:
        return [m for _, m, _ in self._ordered(chain)]

    def member_data(self, chain: str, member: str) -> bytes | None:
        return next((d for _, m, d in self._ordered(chain) if m == member), None)

    # -- notification ---------------------------------------------------------------
    def watch(self, chain: str, callback: MembersCallback) -> None:
        self._call("watch", self._client.ensure_path_async, self._path(chain))
        deliver = changes_only(callback, f"chain {chain!r}")

        def on_children(znodes: list[str]) -> bool | None:
            if self._closed:
                return False  # tells kazoo to drop the watch
            try:
                deliver([m for _, m, _ in self._ordered(chain, znodes)])
            except CoordinatorError as exc:  # no caller to raise to on kazoo's thread
                log.warning("could not read chain %r after a change: %s", chain, exc)
            return None

        # kazoo calls on_children now (this thread), then after each change (its
        # thread), one call at a time; it re-arms the watch after a reconnection.
        try:
            ChildrenWatch(self._client, self._path(chain), on_children)
        except (ConnectionLoss, SessionExpiredError) as exc:  # kazoo's retries ran out
            raise CoordinatorError(f"ZooKeeper at {self._hosts} failed watch "
                                   f"({type(exc).__name__})") from None

    def watch_predecessor(self, chain: str, member: str, callback: PredecessorCallback) -> None:
        me = self._mine.get((chain, member))
        if me is None:
            raise KeyError(f"{member!r} was not joined to chain {chain!r} through this coordinator")
        lock, deliver = threading.Lock(), changes_only(callback, repr(member))

        def follow() -> None:
            while not self._closed and self._mine.get((chain, member)) == me:
                order = self._ordered(chain)
                znodes = [z for z, _, _ in order]
                if me not in znodes:
                    return  # our own znode is gone: the watch ends with us
                i = znodes.index(me)
                pred = order[i - 1] if i else None
                # Arm a one-shot watch on the predecessor only; if it vanished since the
                # listing, look again rather than wait for an event that will not come.
                if pred is None or self._call("watch", self._client.exists_async,
                                              self._path(chain, pred[0]), watch=check):
                    deliver(pred[1] if pred else None)
                    return

        def check(event: object = None) -> None:
            try:
                with lock:  # the first call and a watch event may overlap
                    follow()
            except CoordinatorError as exc:
                if event is None:
                    raise
                log.warning("lost track of the predecessor of %r: %s", member, exc)

        check()

    # -- key-value ------------------------------------------------------------------
    # A value znode is written in two steps (create empty, then set), so its version is
    # >= 1; parents that makepath created implicitly keep version 0 and read as absent.
    def put(self, key: str, value: bytes) -> None:
        path, value = f"{self._root}/kv/{check_key(key)}", check_value("value", value)
        with contextlib.suppress(NodeExistsError):
            self._call("put", self._client.create_async, path, b"", makepath=True)
        self._call("put", self._client.set_async, path, value)

    def get(self, key: str) -> bytes | None:
        try:
            value, stat = self._call("get", self._client.get_async, f"{self._root}/kv/{check_key(key)}")
        except NoNodeError:
            return None
        return value if stat.version > 0 else None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # stop() ends the session, so the server deletes our ephemeral znodes at once.
        self._client.stop()
        self._client.close()
