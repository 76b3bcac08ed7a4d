"""Coordinator contract, run on the in-process backend and on a real ZooKeeper server.

A crash is real on ZooKeeper: the member lives in a subprocess that is SIGKILLed, so
only the session timeout can reveal it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trainthrough.coord.base import Coordinator, CoordinatorError
from trainthrough.coord.local import LocalCoordinator
from trainthrough.coord.zkserver import ZooKeeperServer
from trainthrough.errors import UserError

SESSION = 1.0  # seconds; the test server's tickTime (0.5 s) allows 1 to 10 s

_MEMBER = """
import sys, time
from trainthrough.coord.zookeeper import ZooKeeperCoordinator
hosts, ns, chain, member, session = sys.argv[1:]
ZooKeeperCoordinator(hosts, namespace=ns, session_timeout=float(session)).join(chain, member)
print("joined", flush=True)
time.sleep(120)
"""


class Backend:
    """One coordinator under test, plus ways to add members held by other sessions."""

    def __init__(self, kind: str, server: ZooKeeperServer | None) -> None:
        self.kind, self._server = kind, server
        self._ns = f"/tt-{uuid.uuid4().hex[:8]}"  # each test gets a fresh namespace
        self._others: list[Coordinator] = []
        self._procs: list[subprocess.Popen[str]] = []
        self.coord = self.session()
        # How long a crash may take to show: ZooKeeper needs the session to time out.
        self.detect = 0.0 if kind == "local" else SESSION + 1.0

    def session(self) -> Coordinator:
        """A coordinator with its own session (local: the one shared object)."""
        if self.kind == "local":
            return getattr(self, "coord", None) or LocalCoordinator()
        from trainthrough.coord.zookeeper import ZooKeeperCoordinator

        assert self._server is not None
        c = ZooKeeperCoordinator(self._server.hosts, namespace=self._ns, session_timeout=SESSION)
        self._others.append(c)
        return c

    def crashable(self, chain: str, member: str) -> Callable[[], None]:
        """Join ``member`` from a session of its own; return a function that crashes it."""
        if self.kind == "local":
            assert isinstance(self.coord, LocalCoordinator)
            self.coord.join(chain, member)
            return lambda: self.coord.expire(chain, member)  # type: ignore[attr-defined]
        assert self._server is not None
        proc = subprocess.Popen(
            [sys.executable, "-c", _MEMBER, self._server.hosts, self._ns, chain, member,
             str(SESSION)], stdout=subprocess.PIPE, text=True)  # fmt: skip
        self._procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "joined"

        def crash() -> None:
            os.kill(proc.pid, signal.SIGKILL)  # no clean close: the session must expire
            proc.wait()

        return crash

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for c in [self.coord, *self._others]:
            c.close()


@pytest.fixture(params=["local", "zookeeper"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    server = request.getfixturevalue("zk_server") if request.param == "zookeeper" else None
    b = Backend(request.param, server)
    yield b
    b.close()


class Recorder:
    """Collects watch callbacks (they may arrive on another thread)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, value: Any) -> None:
        with self._lock:
            self.calls.append(value)

    @property
    def last(self) -> Any:
        with self._lock:
            return self.calls[-1] if self.calls else "<no call>"


def wait_for(cond: Callable[[], bool], timeout: float) -> float:
    """Poll ``cond`` until true; return the seconds it took, fail after ``timeout`` (+0.5 s)."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout + 0.5:
            pytest.fail(f"condition not met within {timeout + 0.5:g} s")
        time.sleep(0.01)
    return time.monotonic() - start


def test_join_order_is_chain_order(backend: Backend) -> None:
    c = backend.coord
    ids = [c.join("shard0", m, data=m.encode()) for m in ("r0", "r1", "r2")]
    assert ids == sorted(ids) and len(set(ids)) == 3 and all(i.startswith("m-") for i in ids)
    assert c.members("shard0") == ["r0", "r1", "r2"]
    assert (c.head("shard0"), c.tail("shard0")) == ("r0", "r2")
    assert c.member_data("shard0", "r1") == b"r1" and c.member_data("shard0", "nope") is None
    assert c.members("shard1") == [] and c.head("shard1") is None and c.tail("shard1") is None
    with pytest.raises(ValueError, match="already live"):
        c.join("shard0", "r1")
    for chain, member in [("shard/0", "r"), ("shard0", ""), ("shard0", "a b")]:
        with pytest.raises(ValueError, match="invalid"):
            c.join(chain, member)


def test_leave_closes_the_chain_and_watchers_see_it(backend: Backend) -> None:
    c, seen = backend.coord, Recorder()
    c.watch("shard0", seen)
    assert seen.calls == [[]]  # called at once with the current (empty) chain
    for m in ("a", "b", "c"):
        c.join("shard0", m)
    wait_for(lambda: seen.last == ["a", "b", "c"], 2.0)
    c.leave("shard0", "b")
    assert c.members("shard0") == ["a", "c"]
    wait_for(lambda: seen.last == ["a", "c"], 2.0)
    assert all(x != y for x, y in zip(seen.calls, seen.calls[1:]))  # changes only
    with pytest.raises(KeyError):
        c.leave("shard0", "b")
    c.join("shard0", "b")  # a member that left may come back: at the tail
    assert c.members("shard0") == ["a", "c", "b"]


def test_crashed_member_vanishes_and_watchers_fire(backend: Backend) -> None:
    c, seen = backend.coord, Recorder()
    c.join("shard0", "a")
    crash = backend.crashable("shard0", "b")
    c.join("shard0", "c")
    c.watch("shard0", seen)
    assert seen.last == ["a", "b", "c"]
    crash()
    took = wait_for(lambda: seen.last == ["a", "c"], backend.detect)
    assert c.members("shard0") == ["a", "c"]
    if backend.kind == "zookeeper":  # only the session timeout can reveal a SIGKILL
        assert SESSION * 0.5 < took <= SESSION + 1.0


def test_head_failure_promotes_successor_and_new_members_join_at_tail(backend: Backend) -> None:
    c, pred = backend.coord, Recorder()
    crash_head = backend.crashable("shard0", "h")
    c.join("shard0", "s")
    c.watch_predecessor("shard0", "s", pred)
    assert pred.calls == ["h"] and c.head("shard0") == "h"
    crash_head()
    wait_for(lambda: pred.last is None, backend.detect)  # None: "s" is now the head
    assert c.head("shard0") == "s"
    c.join("shard0", "n")
    assert c.members("shard0") == ["s", "n"] and c.tail("shard0") == "n"
    assert pred.calls == ["h", None]  # a join behind "s" does not wake it
    with pytest.raises(KeyError):
        c.watch_predecessor("shard0", "h", pred)


def test_key_value_store(backend: Backend) -> None:
    c = backend.coord
    assert c.get("shard0/latest") is None
    c.put("shard0/latest", b"ckpt-00000230")
    assert c.get("shard0/latest") == b"ckpt-00000230"
    c.put("shard0/latest", b"ckpt-00000240")
    assert c.get("shard0/latest") == b"ckpt-00000240"
    assert c.get("shard0") is None  # a key's prefix is not a key
    c.put("empty", b"")
    assert c.get("empty") == b""
    with pytest.raises(ValueError, match="invalid"):
        c.put("a//b", b"x")
    with pytest.raises(TypeError, match="bytes"):
        c.put("k", "text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        c.put("k", bytes(1_000_001))


def test_closed_coordinator_refuses_calls(backend: Backend) -> None:
    c = backend.session()
    c.close()
    c.close()  # idempotent
    with pytest.raises(CoordinatorError, match="closed"):
        c.members("shard0")


def test_zookeeper_sessions_share_state_and_clean_close_is_immediate(zk_server: Any) -> None:
    b = Backend("zookeeper", zk_server)
    try:
        first, second = b.coord, b.session()
        first.join("shard0", "a", data=b"addr-a")
        first.put("shard0/latest", b"ckpt-1")
        assert second.members("shard0") == ["a"] and second.member_data("shard0", "a") == b"addr-a"
        first.close()  # a clean close ends the session: no timeout to wait for
        assert wait_for(lambda: second.members("shard0") == [], 0.5) < 0.5
        assert second.get("shard0/latest") == b"ckpt-1"  # values outlive their writer
    finally:
        b.close()


def test_unreachable_server_is_a_quick_user_error() -> None:
    pytest.importorskip("kazoo")
    from trainthrough.coord.zookeeper import ZooKeeperCoordinator

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(UserError, match=f"127.0.0.1:{port}.*start one"):
        ZooKeeperCoordinator(f"127.0.0.1:{port}", connect_timeout=1.0)
    assert time.monotonic() - start < 3.0
    with pytest.raises(UserError, match="host:port"):
        ZooKeeperCoordinator("127.0.0.1:abc")
    with pytest.raises(UserError, match="namespace"):
        ZooKeeperCoordinator(f"127.0.0.1:{port}", namespace="relative")


def test_server_listens_on_loopback_and_stops_by_its_pid(zk_server: Any) -> None:
    server = ZooKeeperServer().start()
    pid, log = server.pid, server.log_path
    try:
        assert pid and server.hosts.startswith("127.0.0.1:")
        assert "binding to port" in log.read_text()  # logs stay in the server's own dir
    finally:
        server.stop()
    assert server.pid is None and not log.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    server.stop()  # idempotent


def test_coord_imports_neither_torch_nor_ray() -> None:
    code = ("import sys, trainthrough.coord.local, trainthrough.coord.zookeeper, "
            "trainthrough.coord.zkserver; print(sorted({'torch', 'ray'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_python_m_coord_runs_a_command_beside_a_server(zk_server: Any) -> None:
    """``python -m trainthrough.coord --port N -- COMMAND``: COMMAND sees a serving
    server, its exit status is the module's, and the server is gone afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = ("import socket, sys; s = socket.create_connection(('127.0.0.1', %d)); "
             "s.sendall(b'srvr'); sys.exit(7 if b'Zookeeper version' in s.recv(64) else 1)")
    r = subprocess.run([sys.executable, "-m", "trainthrough.coord", "--port", str(port), "--",
                        sys.executable, "-c", probe % port], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 7, r.stderr
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_python_m_coord_refuses_a_busy_port_in_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "trainthrough.coord", "--port", str(port),
                            "--", "true"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"port {port}" in r.stderr and "--port" in r.stderr


def test_a_throwaway_server_dies_with_the_process_that_started_it() -> None:
    """However its starter ends (here SIGKILL, which runs no clean-up), the server
    does not outlive it holding the port."""
    from .zk import require_zookeeper

    require_zookeeper("the throwaway ZooKeeper server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import time; from trainthrough.coord.zkserver import ZooKeeperServer as Z; "
            f"Z(port={port}).start(); print('up', flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        p.kill()  # the process this test started, still alive here
        p.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return
        time.sleep(0.1)
    pytest.fail(f"the ZooKeeper server still serves on port {port} after its starter died")
