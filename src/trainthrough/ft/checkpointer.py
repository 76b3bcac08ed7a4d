"""The one checkpointer: when to save (the policy), having it saved, and the accounting.

Every engine uses it; what differs is the :class:`SaveBackend`, which carries a save
out where the state lives and says what it cost: ``sim`` plans each shard's save in
process and times the write on the virtual clock; ``ray`` asks each shard's actor to
save itself (blocking, or a snapshot plus a background write). The bytes, the payload
(tensor data), the seconds training was blocked, and one ``checkpoint`` event per save
(:class:`~trainthrough.events.CheckpointSaved`; ``checkpoint-failed`` per refused
write) are counted here and nowhere else.

Call order: :meth:`Checkpointer.resume_at` once if the run resumes from a checkpoint,
then :meth:`Checkpointer.after_iteration` after every (logical) iteration, and
:meth:`Checkpointer.rewind` when recovery rolls the iteration back; the backend calls
``done`` once the save exists (at once, or later for a background write).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from trainthrough.events import CheckpointFailed, CheckpointSaved, Event
from trainthrough.ft.checkpointing import CheckpointPolicy
from trainthrough.ft.decisions import CheckpointDecision

#: Where events go (the run context's ``emit``, wrapped by the engine).
Emit = Callable[[Event], None]


@dataclass
class SaveReport:
    """What one save wrote (all shards together) and what it cost."""

    nbytes: int  # everything written: tensors, headers, manifests
    payload_bytes: int  # tensor data only
    blocked_seconds: float
    names: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class SaveBackend(Protocol):
    """Carries out one save decision; calls ``done`` when the save exists."""

    def save(self, decision: CheckpointDecision, iteration: int,
             done: Callable[[SaveReport], None]) -> None: ...


class Checkpointer:
    """Applies a :class:`CheckpointPolicy` through a backend and accounts for every save."""

    def __init__(self, policy: CheckpointPolicy, backend: SaveBackend, emit: Emit) -> None:
        self.policy, self.backend, self.emit = policy, backend, emit
        self.count = self.bytes = self.payload_bytes = 0
        #: saves a write of failed in (the storage refused it; with none written it is no
        #: checkpoint): the run goes on from the last one written, and says so
        #: (events.jsonl ``checkpoint-failed``, one per write; the CLI)
        self.failed = 0
        self.blocked = 0.0
        self._last = 0

    def rewind(self, iteration: int) -> None:
        """Recovery rolled the run back to ``iteration``: iterations after it are run
        (and decided about) again."""
        self._last = min(self._last, iteration)

    def resume_at(self, iteration: int) -> None:
        """The run resumes from its checkpoint of ``iteration``: the policy was asked
        about every iteration up to it before the run was interrupted."""
        self._last = iteration

    def after_iteration(self, iteration: int) -> None:
        """Ask the policy about every iteration since the last call (real engines observe
        iterations in jumps; an iteration seen again is not decided twice)."""
        while self._last < iteration:
            self._last += 1
            d = self.policy.decide(self._last)
            if d is not None:
                self.backend.save(d, self._last, self._done(d, self._last))

    def saved_now(self, iteration: int, report: SaveReport, why: str) -> None:
        """Account for a save no policy asked for, made for the reason ``why`` (a
        just-in-time checkpoint as the job is preempted): a full, synchronous save."""
        self._done(CheckpointDecision(fraction=1.0, asynchronous=False), iteration,
                   why)(report)

    def _done(self, d: CheckpointDecision, iteration: int,
              why: str | None = None) -> Callable[[SaveReport], None]:
        def done(r: SaveReport) -> None:
            for message in r.errors:
                self.emit(CheckpointFailed(iteration=iteration, message=message))
            self.failed += bool(r.errors)
            if r.errors and not r.names:
                return  # nothing was written: not a checkpoint
            self.count += 1
            self.bytes += r.nbytes
            self.payload_bytes += r.payload_bytes
            self.blocked += r.blocked_seconds
            self.emit(CheckpointSaved(iteration=iteration, bytes=r.nbytes,
                                      blocked_seconds=r.blocked_seconds,
                                      async_=d.asynchronous, fraction=d.fraction,
                                      names=r.names, why=why))
        return done
