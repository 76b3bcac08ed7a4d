"""Errors a user can fix, and the few exceptions every layer may raise or catch.

Anything raised as :class:`UserError` is printed by the CLI as one line on stderr
and ends the process with exit code 2: no traceback, because the user did nothing
wrong with the code, only with the input.

The bottom layer: it imports nothing, and every module of trainthrough may import it.
"""

from __future__ import annotations

import builtins
import contextlib
import threading
from collections.abc import Iterator
from typing import Any


class UserError(Exception):
    """Bad input: unknown name, malformed spec, impossible size, missing/corrupt file.

    The message must name what to change.
    """


class CheckpointCorrupt(UserError):
    """A checkpoint failed verification (missing file, bad checksum, truncated)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by the CLI's handler so that every ``finally``
    (actors, Ray, rank processes, the run folder) runs as it does for Ctrl-C; the run
    folder records which of the two ended the run."""


class Preempted(Terminated):
    """Every rank of a run got its preemption notice (SIGTERM from outside, one by one):
    the run stops as a SIGTERM to the whole job stops it, with a just-in-time checkpoint
    where it keeps checkpoints, and is resumable."""


_held: list[BaseException] = []  # an interruption that came inside :func:`uninterrupted`
_depth = [0]  # how deep the main thread is in :func:`uninterrupted` blocks


def interrupt(exc: BaseException) -> None:
    """Raise ``exc`` (a :class:`Terminated` or ``KeyboardInterrupt`` from a signal
    handler) now, or, while the main thread is inside :func:`uninterrupted`, when it
    leaves the block.

    Raises:
        BaseException: ``exc``, unless held.
    """
    if _depth[0] > 0:
        _held.append(exc)
        return
    raise exc


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A block a signal handler's exception must not cut in two: a rank process started
    but not yet recorded would outlive the run, since nothing knows to end it. An
    interruption that arrives inside is raised when the block ends (in the main thread;
    other threads are never interrupted by a handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if _depth[0] == 0 and _held:
            exc = _held[0]
            _held.clear()
            raise exc


def terminated(e: BaseException) -> bool:
    """Whether ``e`` is, or was raised while handling, a :class:`Terminated` (Ray may
    re-raise it as a plain ``KeyboardInterrupt``)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, Terminated):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


class Retired(BaseException):
    """This rank process is not in the run any more: a plan left it out (the rank
    session, :mod:`trainthrough.engines.gloo.session`, says so), and ``Loop.step``
    raises this to unwind a user's loop (:mod:`trainthrough.loop`). A BaseException,
    so a user's loop that catches Exception still unwinds."""


class RunStalled(RuntimeError):
    """The run cannot make progress (a service it needs stays unreachable, nothing is
    applied any more): it ends with this reason instead of waiting forever. Nothing the
    user typed is wrong, so it is not a :class:`UserError`; the CLI prints the reason
    on one line and exits with status 1. Takes one message argument (it pickles)."""


class RankFailed(RunStalled):
    """A rank's own error ended the run: it repeated the same way more often than
    ``max_restarts`` allows, or came while the ranks were starting.

    The message is one line, the rank's error first (``rank 0: ValueError: boom (at
    step 12, 4 times in a row; ...)``); the traceback is in the run folder
    (``events.jsonl``, the ``rank-error`` event). ``type_name``: the error's class as
    ``module.Qualname`` (``builtins.ValueError``; ``""`` when the process ended without
    one: killed, or its heartbeat stopped); ``message``: its text. Nothing of the
    rank's exception object crosses: :func:`rebuilt` makes one of the same builtin type
    from the name and the text. A :class:`RunStalled`: the CLI prints the line and
    exits with status 1. Plain fields: it pickles.
    """

    def __init__(self, reason: str, slot: int = -1, type_name: str = "", message: str = "",
                 step: int = -1, times: int = 0) -> None:
        super().__init__(reason)
        self.slot, self.type_name, self.message = slot, type_name, message
        self.step, self.times = step, times

    def __reduce__(self) -> tuple[Any, ...]:
        return (RankFailed, (str(self), self.slot, self.type_name, self.message, self.step,
                             self.times))


def rebuilt(e: RankFailed) -> Exception:
    """The rank's own exception, when its class is one of Python's builtin ones
    (``ValueError``, ``KeyError``, ``RuntimeError``, ...): a new one of that class with
    the rank's message, caused by ``e``. Any other class (the user's own, a library's)
    cannot be made without running code the rank's message names: ``e`` itself then,
    whose ``type_name`` says what it was."""
    module, _, name = e.type_name.rpartition(".")
    cls = getattr(builtins, name, None) if module == "builtins" else None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return e
    try:
        out = cls(e.message)
    except Exception:  # noqa: BLE001 - a builtin that takes other arguments
        return e
    out.__cause__ = e
    return out


class CheckpointWriteFailed(OSError):
    """A checkpoint could not be written (the disk full, the folder made unwritable or
    removed under the run), naming it, where, and the storage's reason. Engines report
    it as a failed save (ft/checkpointer.py) and train on from the last one written;
    the run says so. An ``OSError``, as what it wraps, for code that catches those; one
    message argument (it pickles)."""


def original(e: BaseException) -> BaseException:
    """``e``, or for an error raised in a Ray actor the one raised there (Ray wraps it,
    with the actor's traceback, in a task error whose ``cause`` it is)."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


def reason(e: BaseException) -> str:
    """The first line of what :func:`original` of ``e`` says."""
    inner = original(e)
    text = str(inner).strip().splitlines()
    return text[0] if text else type(inner).__name__
