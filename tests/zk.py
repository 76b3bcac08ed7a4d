"""Whether a test can have a real ZooKeeper server: skipped locally, failed under CI."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import threading

import pytest

from trainthrough.coord.zkserver import find_zookeeper


def require_zookeeper(what: str) -> None:
    """Skip (locally) or fail (under CI, where ``.ci/run`` installs both) when the
    ZooKeeper server or kazoo is missing; ``what`` names who needs it."""
    missing = None
    if find_zookeeper() is None:
        missing = "no ZooKeeper server installed (Debian package `zookeeper`, needs java)"
    elif importlib.util.find_spec("kazoo") is None:
        missing = "kazoo is not installed (extra `zookeeper`)"
    if missing:
        msg = f"{what} needs {missing}; .ci/run installs it (see .ci/run and the Makefile)"
        if os.environ.get("CI"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


class Partition:
    """A TCP relay on 127.0.0.1 to a ZooKeeper server that a test can cut and heal.

    While cut, every connection through it is shut and new ones are shut on accept: the
    server hears nothing from the clients behind it and expires their sessions on its
    own clock, once they are older than their timeout. Pausing the server instead
    (SIGSTOP) leaves that to a race on resume: a client's queued reconnect, processed
    before the server's expiry thread runs, renews the session, and no session expires.
    """

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.hosts = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked on it

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self.cut()
        self._listener.close()

    def __enter__(self) -> Partition:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._cut.is_set():
                near.close()
                continue
            try:
                far = socket.create_connection(self._upstream, timeout=2.0)
            except OSError:
                near.close()
                continue
            far.settimeout(None)
            with self._lock:
                self._open |= {near, far}
            for src, dst in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open -= {src, dst}
            src.close()
