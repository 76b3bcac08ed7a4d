"""The rank processes a controller started: spawn, readiness, exits, and kills by PID.

Local ranks are forked from a warm zygote that imported the rank code once
(:mod:`.zygote`), or, with ``TRAINTHROUGH_RANK_START=exec``, started as ``python -m
trainthrough.engines.gloo.rank_main`` with their spec as JSON on stdin (as torchrun
starts workers), each importing torch itself. Never multiprocessing's ``spawn``: it
re-imports the caller's main script in every rank, which re-ran a user's top-level
training code (or failed when there was none to import, as under ``python -c``); and
never a fork of the controller (a forked torch with initialised thread pools can
deadlock; the zygote runs no tensor operation before it forks). Every one is
ended by :meth:`Procs.shutdown` when the run ends, however it ends, and a rank whose
controller is gone stops at its next store call. The only processes this module ever
signals are the ones it
started, identified by pid and start time when they started
(:mod:`trainthrough.engines.signals`); it never looks processes up by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from trainthrough.engines.gloo import zygote
from trainthrough.engines.gloo.protocol import RankSpec, RunSpec, has
from trainthrough.engines.signals import Pinned, pin
from trainthrough.errors import UserError, uninterrupted

if TYPE_CHECKING:  # only named: a Ray node's rank host imports this without torch
    import torch.distributed as dist

#: How local rank processes start: ``fork`` from the warm zygote, or ``exec`` a fresh
#: ``python -m`` each (the environment variable ``TRAINTHROUGH_RANK_START``).
RANK_START = ("fork", "exec")


class Child(Protocol):
    """A started rank process, however it is hosted."""

    pid: int | None  # None until known (an actor reports it once it is up)

    @property
    def exitcode(self) -> int | None:
        """None while it runs; else its exit code (-N: killed by signal N)."""
        ...

    def join(self, timeout: float | None = None) -> None: ...

    def kill(self) -> None:
        """Stop it for good, only if it is the process this run started (and alive)."""
        ...

    def resume(self) -> bool:
        """Continue it if it is stopped (a ``mode=pause`` ends), only if it is the
        process this run started; False while it is not stopped yet (call again)."""
        ...

    def close(self) -> None:
        """Release what hosted it, once it ended (an actor)."""
        ...


Launch = Callable[[RankSpec], Child]


@dataclass
class Proc:
    """One rank process: slot, incarnation of that slot, and how it started."""

    slot: int
    inc: int
    mode: str
    process: Child
    started: float = field(default_factory=time.time)
    died_at: float | None = None
    #: when its heartbeat was last seen, once the controller took it for dead for its
    #: silence (:meth:`Procs.lose`): its death dates from then
    silent_since: float | None = None
    #: the controller took it out of the group (fencing.py): gone for the group, even
    #: while its process still runs (a pause), and never a member again
    fenced: bool = False

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode


class LocalProcess:
    """A rank process started with ``python -m``, pinned at once."""

    def __init__(self, spec: RankSpec) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "trainthrough.engines.gloo.rank_main"],
            stdin=subprocess.PIPE, close_fds=True)
        assert self.popen.stdin is not None
        with self.popen.stdin as pipe:  # the spec is plain values (protocol.RankSpec)
            pipe.write(json.dumps(spec.to_dict()).encode())
        self.pid: int | None = self.popen.pid
        # None: it ended before it was pinned (then there is nothing to signal).
        self.handle: Pinned | None = pin(self.popen.pid)

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)

    def kill(self) -> None:
        if self.exitcode is None and self.handle is not None:
            self.handle.send()

    def resume(self) -> bool:
        return self.handle is None or self.exitcode is not None or self.handle.resume()

    def close(self) -> None:
        self.join(timeout=0)  # reaped: nothing else holds it
        if self.handle is not None and self.exitcode is not None:
            self.handle.close()


def local_launch() -> Launch:
    """How this run starts local ranks (``TRAINTHROUGH_RANK_START``, ``fork`` by default).

    ``fork`` starts the zygote now, so it imports torch while the run sets up.

    Raises:
        UserError: any other value.
    """
    how = os.environ.get("TRAINTHROUGH_RANK_START", "fork")
    if how == "exec":
        return LocalProcess
    if how != "fork":
        raise UserError(f"TRAINTHROUGH_RANK_START must be one of: {', '.join(RANK_START)} "
                        f"(got {how!r})")
    zygote.shared()
    return zygote.forked


class Procs:
    """Every rank process of one run; ``current[slot]`` is the incarnation in use."""

    def __init__(self, store: dist.Store, base: RunSpec, launch: Launch) -> None:
        self.store, self.base, self.launch = store, base, launch
        self.current: dict[int, Proc] = {}
        self.started: list[Proc] = []
        self._inc: dict[int, int] = {}

    def spawn(self, slot: int, mode: str, attempt: int, executed: int, ctl: int,
              orders: list[dict[str, object]], applied: int = 0,
              restore: int | None = None) -> Proc:
        """Start a rank process for ``slot`` (it becomes the slot's current process).

        ``executed``, ``ctl`` and ``applied`` are the run's counters so far, which a
        restarted process carries on from (a joining one receives them from a peer);
        ``restore``: the checkpoint step a restarted process loads (None: x0).
        """
        inc = self._inc[slot] = self._inc.get(slot, -1) + 1
        spec = RankSpec(self.base, slot, inc, mode, attempt, executed, ctl,
                        [dict(o) for o in orders], applied, restore)
        # SIGTERM or Ctrl-C while a process starts waits until it is recorded: cut in
        # between, it would train on after the run, which ends only what it recorded.
        with uninterrupted():
            p = Proc(slot, inc, mode, self.launch(spec))
            self.current[slot] = p
            self.started.append(p)
        return p

    def ready(self, p: Proc) -> bool:
        return has(self.store, f"ready/{p.slot}/{p.inc}")

    def alive(self, slot: int) -> bool:
        """Whether ``slot``'s current process runs and is still the group's (not fenced)."""
        p = self.current.get(slot)
        return p is not None and p.exitcode is None and not p.fenced

    def fence(self, p: Proc) -> None:
        """Take ``p`` out of the group without ending it (fencing.py), once the group
        has dealt with its loss: gone for the group from now, so its end, whenever it
        comes (it leaves, or it is ended), is not reported as a new death."""
        p.fenced = True
        if p.died_at is None:
            p.died_at = time.time()

    def fenced_running(self) -> list[Proc]:
        """Fenced processes that still run (paused, hung, or on their way out)."""
        return [p for p in self.started if p.fenced and p.exitcode is None]

    def newly_dead(self) -> list[Proc]:
        """Current processes that ended since the last call (each reported once)."""
        out = []
        for p in self.current.values():
            if p.died_at is None and p.exitcode is not None:
                p.died_at = p.silent_since if p.silent_since is not None else time.time()
                out.append(p)
        return out

    def lose(self, p: Proc, silent_since: float) -> None:
        """End a process whose heartbeat stopped at ``silent_since`` (frozen, or
        stopped), fenced out of the group: its end is then reported by
        :meth:`newly_dead`, as a death at that time, and recovered like any other."""
        p.silent_since, p.fenced = silent_since, True
        p.process.kill()

    def kill(self, p: Proc) -> None:
        """SIGKILL one process this controller started (a stopped one dies too)."""
        p.process.kill()
        p.process.join(timeout=5)
        if p.died_at is None:
            p.died_at = time.time()

    def wait_exit(self, procs: list[Proc], timeout: float) -> None:
        """Give ``procs`` ``timeout`` seconds to end on their own, then kill the rest."""
        end = time.time() + timeout
        for p in procs:
            p.process.join(timeout=max(0.0, end - time.time()))
        for p in procs:
            self.kill(p)

    def shutdown(self, timeout: float = 5.0) -> None:
        """End every process this run started (normally all have exited already; 0:
        kill the rest at once). Fenced ones are ended at once: nothing waits for them,
        and one still stopped would never end on its own."""
        for p in self.fenced_running():
            self.kill(p)
        self.wait_exit([p for p in self.started if p.exitcode is None], timeout)
        for p in self.started:
            p.process.close()
