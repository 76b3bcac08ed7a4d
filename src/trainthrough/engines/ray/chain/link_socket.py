"""A chain link's data plane: one TCP connection from a replica to its successor.

Why not a Ray actor call per forward: a Ray call costs each side several times the CPU
of applying a push, and a replicated chain is bound by CPU; a frame on a connection that
stays open costs a ``sendmsg`` and a ``recv_into``.

The format is not pickle: a fixed header (magic, JSON length, payload length), a JSON
header (:func:`~trainthrough.engines.ray.chain.wire.describe`) and the tensors' raw bytes;
the reply is a status byte and a message. Nothing received is ever unpickled or
evaluated: a frame becomes tensors of a few dtypes or is dropped with the connection.

Who may connect: the listener binds to this node's IP (127.0.0.1 on a local cluster;
never all interfaces), and a connection counts only after it sent the listener's
random token, which only a Ray call to this actor (``chain_address``) hands out.

Order of calls. The successor: :class:`Listener` once per process, its ``address``
given to predecessors; every connection is served on a thread of its own, one frame
at a time, in order (``serve`` runs the forward and returns, or raises: the error
goes back as the reply). The predecessor: :class:`Channel` per link epoch, then for
each forward :meth:`Channel.send`, then :meth:`Channel.reply` (one frame outstanding;
the chain link sends the next only after the reply), :meth:`Channel.close` when the
link changes.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import secrets
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any, cast

import numpy as np

_MAGIC = b"TTL1"
_HEAD = struct.Struct("!4sIQ")  # magic, JSON header bytes, payload bytes
_REPLY = struct.Struct("!BI")  # status (0: applied; 1: refused, message follows), length
_TOKEN_BYTES = 16
MAX_HEADER = 16 << 20  # a header this long is not ours: the connection is dropped
MAX_PAYLOAD = 1 << 34
Address = tuple[str, int, bytes]  # host, port, token
Serve = Callable[[dict[str, Any], np.ndarray], None]


class LinkError(ConnectionError):
    """The successor refused a forward (its message), or the connection failed."""


def _recv_exact(sock: socket.socket, n: int) -> np.ndarray:
    """``n`` bytes into a fresh buffer (no zero-fill: it is overwritten)."""
    buf = np.empty(n, np.uint8)
    view, got = memoryview(cast(Any, buf)), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise LinkError("connection closed")
        got += k
    return buf


def _send_all(sock: socket.socket, buffers: list[Any]) -> None:
    """Scatter-gather send (the tensors go from their own memory, no concatenation)."""
    views = [memoryview(b).cast("B") for b in buffers if len(memoryview(b).cast("B"))]
    while views:
        sent = sock.sendmsg(views[:512])  # IOV_MAX is 1024 on Linux
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0], sent = views[0][sent:], 0


class Listener:
    """Accepts predecessors' connections on ``host`` and serves each on a thread."""

    def __init__(self, host: str, serve: Serve) -> None:
        if host in ("", "0.0.0.0", "::"):
            raise ValueError("a chain link listens on the node's own address, never all")
        self._serve = serve
        self._token = secrets.token_bytes(_TOKEN_BYTES)
        self._sock = socket.create_server((host, 0))
        self.address: Address = (host, self._sock.getsockname()[1], self._token)
        threading.Thread(target=self._accept, daemon=True, name="chain-listen").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._connection, args=(conn,), daemon=True,
                             name="chain-serve").start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5.0)  # for the token only: then a frame may be far off
                token = bytes(_recv_exact(conn, _TOKEN_BYTES))
                if not hmac.compare_digest(token, self._token):
                    return
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while True:
                    magic, hlen, plen = _HEAD.unpack(bytes(_recv_exact(conn, _HEAD.size)))
                    if magic != _MAGIC or hlen > MAX_HEADER or plen > MAX_PAYLOAD:
                        return
                    header = json.loads(bytes(_recv_exact(conn, hlen)))
                    payload = _recv_exact(conn, plen)
                    try:
                        self._serve(header, payload)
                        conn.sendall(_REPLY.pack(0, 0))
                    except Exception as e:  # refused (ChainBroken) or malformed: say why
                        msg = f"{type(e).__name__}: {e}".encode()[:4096]
                        conn.sendall(_REPLY.pack(1, len(msg)) + msg)
            except (OSError, ValueError):
                return  # the predecessor went away (or was not one): nothing to answer

    def close(self) -> None:
        self._sock.close()


class Channel:
    """This replica's connection to its successor's :class:`Listener`."""

    def __init__(self, address: Address, timeout: float) -> None:
        host, port, token = address
        self._timeout = timeout
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(token)

    def send(self, header: bytes, buffers: list[Any]) -> None:
        """One frame: ``header`` (JSON) and the payload ``buffers``.

        Raises:
            OSError: the connection failed.
        """
        plen = sum(memoryview(b).nbytes for b in buffers)
        _send_all(self._sock, [_HEAD.pack(_MAGIC, len(header), plen), header, *buffers])

    def reply(self) -> None:
        """Wait for the reply to the frame sent last.

        Raises:
            LinkError: the successor refused it, or the connection failed or timed out.
        """
        try:
            status, n = _REPLY.unpack(bytes(_recv_exact(self._sock, _REPLY.size)))
            msg = bytes(_recv_exact(self._sock, n)).decode(errors="replace") if n else ""
        except OSError as e:
            raise LinkError(f"no reply from the successor: {e}") from e
        if status:
            raise LinkError(msg)

    def close(self) -> None:
        """Also wakes a thread waiting in :meth:`reply` (it raises)."""
        with contextlib.suppress(OSError):  # already closed by the peer
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
