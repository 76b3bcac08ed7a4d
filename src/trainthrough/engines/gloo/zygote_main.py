"""The zygote: a process that has imported torch and the rank code once, and forks ranks.

Started by :class:`~.zygote.Zygote` as ``python -m trainthrough.engines.gloo.zygote_main
SOCKET``. It imports the rank program (:mod:`.rank_main`, and with it torch and
torch.distributed) without running a single tensor operation, so no thread pool is
initialised when it forks. Then it serves, one at a time, requests on the Unix socket
``SOCKET`` (in a folder only the user can enter):

1. the client sends one byte carrying two file descriptors (SCM_RIGHTS): its stdout
   and stderr, which the rank writes to, as a child of the client would;
2. then a length-prefixed JSON request ``{"spec", "env", "cwd"}``;
3. the zygote forks; the child takes the descriptors, the environment and the working
   folder of the request, reseeds what a fresh interpreter would seed afresh, and runs
   :func:`.rank_main.main`; the zygote answers ``pid <pid>``, with a pidfd of the
   child attached (SCM_RIGHTS): the client pins the rank with it
   (:func:`~trainthrough.engines.signals.adopt`), so that it reaches that very process
   even if this zygote dies first and the rank is left to init;
4. when the child ends, the zygote answers ``exit <code>`` on the same connection
   (``-N``: killed by signal N, as :class:`subprocess.Popen` reports it) and closes it.

It prints ``ready`` on its stdout once it listens, and exits when its stdin closes (the
client ended, however it ended); ranks it forked are not stopped then: a rank whose
controller is gone stops at its next store call, as a ``python -m`` rank does. So it
ignores SIGTERM: a SIGTERM to the whole job (a preemption's notice) is for the
controller and the ranks to act on, and a zygote gone before its ranks would leave
their exit codes unknown (reported as 1), turning a clean drain into failures.

What a fork does not renew: variables read when torch is imported (``OMP_NUM_THREADS``
and the like) come from the zygote's start; :func:`~.zygote.shared` starts a new zygote
when those differ.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys
from typing import Any

from trainthrough.engines.forked import take_place
from trainthrough.engines.gloo import rank_main

_LEN = struct.Struct("!I")


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ConnectionError("client closed the connection mid-request")
        out += chunk
    return bytes(out)


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    _, fds, _, _ = socket.recv_fds(conn, 1, 2)
    (size,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
    return json.loads(_recv_exact(conn, size)), fds


#: Signals held while a rank is forked and handed over (see :func:`serve`).
_HELD = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _child(request: dict[str, Any], fds: list[int], keep_closed: list[int]) -> None:
    """In the forked child: become a rank process as ``python -m rank_main`` would be."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a fresh process has it
        for fd in keep_closed:  # the zygote's sockets and pipes are not the rank's
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (null, *fds):
            os.close(fd)
        take_place(request["cwd"], request["env"])
        sys.path[0] = request["cwd"]  # what ``python -m`` started in cwd puts first
        code = rank_main.main(rank_main.RankSpec.from_dict(request["spec"]))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - a rank must end with a code, never return here
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _warm_for(request: dict[str, Any]) -> None:
    """Import here, once, what the rank of ``request`` would otherwise import itself.

    A user's own loop builds a ``torch.optim`` optimizer, and the first optimizer built
    in a process imports ``torch._dynamo`` (its ``_disable_dynamo`` wrapper): about 1 s
    of CPU in every rank, replacement and restarted rank, before its first step. Done
    in the zygote before the first such fork, every later fork inherits it. The
    built-in workloads build none, so a zygote that serves only them never pays it.
    The import starts no thread, so the forks stay safe (the module docstring)."""
    if request["spec"]["run"].get("loop") and "torch._dynamo" not in sys.modules:
        import torch._dynamo  # noqa: F401


def serve(path: str) -> None:
    """Listen on ``path`` and fork a rank per request until stdin closes."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd fires
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # its lifetime is its client's (above)
    signal.set_wakeup_fd(wake_w)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    waiting: dict[int, socket.socket] = {}  # child pid -> its client's connection
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([listener, wake_r, stdin], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        _reap(waiting)
        if stdin in readable and not os.read(stdin, 4096):
            return  # the client is gone
        if listener in readable:
            conn, _ = listener.accept()
            try:
                request, fds = _read_request(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            _warm_for(request)
            sys.stdout.flush()
            sys.stderr.flush()
            # A signal to the whole job (``timeout -s TERM``, Ctrl-C) that ended this
            # process between the fork and the hand-over would leave a rank nobody
            # pinned: held until its pidfd is sent (the child restores the mask).
            held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
            pid = os.fork()
            if pid == 0:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                own = [listener.fileno(), wake_r, wake_w, conn.fileno(),
                       *(c.fileno() for c in waiting.values())]
                _child(request, fds, own)  # 0, 1 and 2 are replaced there, not closed
            try:
                for fd in fds:
                    os.close(fd)
                # Opened before the child can be reaped (only this loop reaps it), so the
                # descriptor refers to it, never to a process that took its pid later.
                pidfd = os.pidfd_open(pid)
                try:
                    socket.send_fds(conn, [f"pid {pid}\n".encode()], [pidfd])
                finally:
                    os.close(pidfd)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            waiting[pid] = conn
            _reap(waiting)


def _reap(waiting: dict[int, socket.socket]) -> None:
    """Report every child that ended to its client."""
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):  # the client went away: nobody to tell
                conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
