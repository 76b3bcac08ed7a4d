"""The entry point of one rank process of the ``gloo`` engine.

Started by the controller (forked from the warm zygote, :mod:`.zygote_main`, or
``python -m`` with the spec as JSON on stdin) with a :data:`RankSpec`: the resolved
config, its slot and incarnation, the store's port, its failure orders, and how it
starts (``fresh``, ``restart`` from the checkpoint step the controller chose, or
``join`` a running group). Then, attempt after attempt (protocol.py): wait for the
plan, form the group, recover as the plan says, train; on a collective error report
and wait for the next plan. A rank that is not in a plan, or is told to exit, ends.

Anything other than a failed collective is an error of this rank: it leaves its last
words for the controller (one line, its type and message, its traceback:
:func:`~.protocol.write_last_words`) and the process exits with code 1, so no peer
waits on it; the controller recovers the loss, and ends the run with that error once
it repeats (``max_restarts``). They go over a fresh store connection if this process's
own broke (the store drops a client that sent it a value it refuses).

From its start to its end the process beats (:class:`~.liveness.Heartbeat`), so the
controller can tell a rank that computes, however long, from one that stopped; and,
where the engine says so, takes SIGTERM as its preemption notice (:mod:`.notice`): it
leaves the group at a step boundary instead of dying in the middle of a step.

With ``spec["loop"]`` (a user's own loop, :mod:`trainthrough.loop`) the rank runs the
program the loop's marker names instead (:func:`loop_program`), imported by that name.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist

from trainthrough.config import RunConfig
from trainthrough.engines.gloo.liveness import Heartbeat
from trainthrough.engines.gloo.messages import RankError
from trainthrough.engines.gloo.net import IFNAME_ENV, gloo_interface
from trainthrough.engines.gloo.notice import RankNotice
from trainthrough.engines.gloo.protocol import (
    PLAN_WAIT_SECONDS,
    RankSpec,
    connect,
    sign,
    write_last_words,
)
from trainthrough.engines.gloo.session import RankSession
from trainthrough.engines.gloo.timing import LAST_WORDS_SECONDS
from trainthrough.engines.gloo.trainer import Trainer
from trainthrough.errors import UserError
from trainthrough.workloads import reference
from trainthrough.workloads.user_loop import TrainingLoop

#: A rank program: ``program(spec, store)`` runs this process's part of the run.
RankProgram = Callable[[RankSpec, dist.TCPStore], None]


def main(spec: RankSpec) -> int:
    """Run one rank process to its end; its exit code (1: a bug, posted with its traceback)."""
    # Ranks share a few cores: one intra-op thread each.
    torch.set_num_threads(1)
    sign(spec.slot, spec.inc)  # every message this process posts carries its token
    store = connect(spec.run.host, spec.run.port, timeout=PLAN_WAIT_SECONDS)
    beat = Heartbeat(spec.run.host, spec.run.port, spec.slot, spec.inc, spec.run.heartbeat)
    notice = (RankNotice.install(spec.run.host, spec.run.port, spec.slot, spec.inc)
              if spec.run.notice else None)
    try:
        # Gloo binds to the interface net.py chooses (loopback for a local run), set
        # before any group is formed.
        os.environ[IFNAME_ENV] = _SET[IFNAME_ENV] = gloo_interface(spec.run.net,
                                                                   _user_ifname())
        if spec.run.loop:  # a user's own training loop drives the session
            loop_program(spec.run.loop)(spec, store)
        else:
            _run(spec, store)
    except UserError as e:  # the user's to fix (a diverged loss): one line, no traceback
        _tell(spec, store, RankError(slot=spec.slot, inc=spec.inc, user=str(e)))
        return 1
    except Exception as e:  # tell the controller rather than leave peers waiting
        _tell(spec, store, error_message(spec, e))
        return 1
    finally:
        beat.close()
        if notice is not None:
            notice.close()
    return 0


def error_message(spec: RankSpec, e: BaseException) -> RankError:
    """What the controller is told of ``e``, raised in this rank process."""
    kind = type(e)
    name = kind.__qualname__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"
    text = str(e)
    first = text.strip().splitlines()[0] if text.strip() else ""
    session = RankSession.current
    return RankError(slot=spec.slot, inc=spec.inc, error=f"{name}: {first}" if first else name,
                     type_name=f"{kind.__module__}.{kind.__qualname__}", message=text,
                     logical=session.tr.logical if session is not None else -1,
                     traceback=traceback.format_exc())


def _tell(spec: RankSpec, store: dist.TCPStore, message: RankError) -> None:
    """Leave ``message`` as this process's last words; over a new connection if its own
    is broken (the store drops a client whose request it refused, a value over its size
    limit say)."""
    try:
        write_last_words(store, message)
        return
    except Exception:  # noqa: BLE001 - whatever broke the connection, try a fresh one
        pass
    # If that fails too the controller is gone: its run already ended and said how;
    # nobody is left to tell, and the terminal is no longer this rank's to write to.
    with contextlib.suppress(Exception):
        write_last_words(connect(spec.run.host, spec.run.port, timeout=LAST_WORDS_SECONDS),
                         message)


def _user_ifname() -> str | None:
    """``GLOO_SOCKET_IFNAME`` as the user set it where this process runs (a value this
    module set in an earlier rank of the same process does not count)."""
    own = os.environ.get(IFNAME_ENV)
    return None if own is None or own == _SET.get(IFNAME_ENV) else own


_SET: dict[str, str] = {}


def loop_program(ref: str) -> RankProgram:
    """The rank program of the user's loop ``ref``: the ``module:function`` its marker
    names (``trainthrough.loop.rank:run_loop``, set by ``@training_loop``), imported here
    by that name.

    Why by name: the loop layer (the user's API, ``launch``) sits above the engines and
    uses them (the rank session, the trainer), so an import of it from here would close
    a cycle, even inside a function. The name comes down as data: the loop layer writes
    it into the marker, which belongs to the workloads layer below the engines, and
    every rank process, a local process or a Ray actor alike, loads the marker by
    reference anyway. (A second ``python -m`` entry point started by the controller
    would need the controller to name the loop's module instead, and Ray actors, which
    call :func:`main` in their own process, a second path.)

    Raises:
        UserError: ``ref`` is not marked with ``@training_loop``, or the program it
            names cannot be imported.
    """
    marked = reference.load(ref)
    if not isinstance(marked, TrainingLoop):
        raise UserError(f"{ref} is not marked with @training_loop")
    return reference.load_reference(marked.rank_entry, "rank program")


def _run(spec: RankSpec, store: dist.TCPStore) -> None:
    cfg = RunConfig.from_dict(spec.run.config)
    tr = Trainer.for_workload(cfg, spec.slot, store, spec.orders, spec.run.t0,
                              spec.run.checkpoint_url, joining=spec.mode == "join")
    session = RankSession(spec, store, tr)
    session.begin()
    while session.step():
        pass
    session.end()


if __name__ == "__main__":  # started by procs.py: the spec arrives as JSON on stdin
    sys.exit(main(RankSpec.from_dict(json.loads(sys.stdin.read()))))
