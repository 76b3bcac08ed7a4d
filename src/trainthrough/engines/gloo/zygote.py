"""Rank processes forked from a warm parent: torch is imported once, not once per rank.

A ``python -m`` rank spends seconds of CPU importing torch before it can do anything,
and so does every replacement and every restarted rank: the group trains short-handed
meanwhile. :class:`Zygote` starts :mod:`.zygote_main` once, which imports the rank code
and forks a rank per request in milliseconds; :class:`ForkedProcess` is the
:class:`~.procs.Child` a controller holds for one of them.

:func:`shared` hands out one zygote per process (a CLI run, a test session, a driver
that runs several loops), started at first use and ended when the process exits. The
zygote is this process's child and each rank is the zygote's, so the ranks are
descendants the project may signal (:mod:`trainthrough.engines.signals`); each is pinned
as it starts, so it stays reachable if the zygote dies before it (a SIGTERM to the whole
process group ends the zygote at once and leaves its ranks to init).

Only the project's rank code is preloaded, never the user's ``__main__``: a rank that
runs a user's loop imports it by reference, as a ``python -m`` rank does.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from trainthrough.engines.gloo.protocol import RankSpec
from trainthrough.engines.signals import Pinned, adopt, pin

#: Environment variables read when torch and its libraries are imported: a zygote
#: started under other values would give its ranks the wrong ones.
_IMPORT_TIME = ("PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH_", "CUDA_", "LD_",
                "GLOO_", "NCCL_")
READY_SECONDS = 120.0  # importing torch: slow on a loaded machine
_LEN = struct.Struct("!I")


class ZygoteFailed(RuntimeError):
    """The zygote could not start or fork a rank."""


class Zygote:
    """One ``zygote_main`` process and the socket it forks ranks on."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="tt-zygote-")  # mode 0700: ours only
        self.path = str(Path(self.folder) / "sock")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainthrough.engines.gloo.zygote_main", self.path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        self.handle: Pinned | None = pin(self.proc.pid)
        self.signature = _signature()
        self._ready = False
        self._lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = READY_SECONDS) -> None:
        """Block until the zygote listens (it has imported the rank code).

        Raises:
            ZygoteFailed: it ended, or did not get ready within ``timeout`` seconds.
        """
        if self._ready:
            return
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.close()
            raise ZygoteFailed(f"the rank zygote did not start (exit code {self.proc.poll()})")
        self._ready = True

    def fork(self, spec: RankSpec) -> ForkedProcess:
        """Fork one rank running ``spec``, writing to this process's descriptors 1 and 2."""
        request = json.dumps({"spec": spec.to_dict(), "env": dict(os.environ),
                              "cwd": os.getcwd()}).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._lock:  # the zygote serves one request at a time
            self.wait_ready()  # its one "ready" line is read by one caller
            try:
                conn.connect(self.path)
                sys.stdout.flush()
                sys.stderr.flush()
                # The process's own descriptors 1 and 2, as a ``python -m`` child
                # inherits them (sys.stdout may be replaced, e.g. captured in memory).
                socket.send_fds(conn, [b"F"], [1, 2])
                conn.sendall(_LEN.pack(len(request)) + request)
                answer, fds = _read_answer(conn, READY_SECONDS)
            except OSError as e:
                conn.close()
                raise ZygoteFailed(f"the rank zygote refused a request: {e}") from None
        if not answer.startswith("pid ") or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            conn.close()
            raise ZygoteFailed(f"the rank zygote answered {answer!r}")
        pid = int(answer[4:])
        return ForkedProcess(pid, conn, adopt(pid, fds[0]))

    def close(self) -> None:
        """End the zygote: its stdin closes and it exits; the ranks it forked are not
        touched (each is ended by its own controller)."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            if self.handle is not None:
                self.handle.send()
            self.proc.wait(5)
        if self.handle is not None:
            self.handle.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)


class ForkedProcess:
    """A rank forked by the zygote: a :class:`~.procs.Child`, pinned by the pidfd the
    zygote opened for it (None: it ended before; nothing to signal then)."""

    def __init__(self, pid: int, conn: socket.socket, handle: Pinned | None) -> None:
        self.pid: int | None = pid
        self.handle = handle
        self._conn: socket.socket | None = conn
        self._code: int | None = None

    @property
    def exitcode(self) -> int | None:
        self._poll(0.0)
        return self._code

    def _poll(self, timeout: float | None) -> None:
        """Read the zygote's ``exit`` line if it comes within ``timeout`` seconds."""
        if self._conn is None:
            if self._code is None and not self._running():
                self._code = 1
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        line = _readline(self._conn, 5.0)
        self._conn.close()
        self._conn = None
        if line.startswith("exit "):
            self._code = int(line[5:])
        elif not self._running():
            # The zygote died without a word: an orphan's code is not ours to read, so
            # a rank that ended meanwhile is reported ended with 1 (not a clean exit).
            self._code = 1

    def _running(self) -> bool:
        return self.handle is not None and self.handle.alive()

    def join(self, timeout: float | None = None) -> None:
        self._poll(timeout)

    def kill(self) -> None:
        if self.exitcode is None and self.handle is not None:
            self.handle.send()

    def resume(self) -> bool:
        return self.handle is None or self.exitcode is not None or self.handle.resume()

    def close(self) -> None:
        self._poll(0.0)
        if self.handle is not None and self._code is not None:
            self.handle.close()


def _read_answer(conn: socket.socket, timeout: float) -> tuple[str, list[int]]:
    """The zygote's ``pid <pid>`` line and the descriptors sent with it."""
    conn.settimeout(timeout)
    try:
        data, fds, _, _ = socket.recv_fds(conn, 64, 1)
    except TimeoutError:
        return "", []
    finally:
        conn.settimeout(None)
    line = data
    if data and not data.endswith(b"\n"):  # a line split in two: the rest, no more fds
        line += _readline(conn, timeout).encode() + b"\n"
    return line.decode(errors="replace").strip(), fds


def _readline(conn: socket.socket, timeout: float) -> str:
    """One ``\\n``-ended line from ``conn`` ('' if it closed first)."""
    conn.settimeout(timeout)
    out = bytearray()
    try:
        while not out.endswith(b"\n"):
            chunk = conn.recv(1)
            if not chunk:
                break
            out += chunk
    except TimeoutError:
        pass
    finally:
        conn.settimeout(None)
    return out.decode(errors="replace").strip()


def _signature() -> tuple[str, ...]:
    return tuple(sorted(f"{k}={v}" for k, v in os.environ.items()
                        if k.startswith(_IMPORT_TIME)))


_shared: Zygote | None = None
_shared_lock = threading.Lock()


def shared() -> Zygote:
    """This process's zygote: started at first use, again if it died or the variables
    read at import time changed; ended when this process exits."""
    global _shared
    with _shared_lock:
        if _shared is not None and (not _shared.alive() or _shared.signature != _signature()):
            _shared.close()
            _shared = None
        if _shared is None:
            _shared = Zygote()
            atexit.register(_shared.close)
        return _shared


def forked(spec: RankSpec) -> ForkedProcess:
    """A :data:`~.procs.Launch`: fork a rank from this process's zygote."""
    return shared().fork(spec)
