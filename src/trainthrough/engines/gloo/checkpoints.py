"""The ``gloo`` host of the data-parallel checkpointer: rank 0 saves, the controller counts.

What is saved and restored is :class:`~trainthrough.ft.dp_checkpoint.ReplicaCheckpoint`
(the same code as ``sim``). :class:`RankSaves` runs in every rank process: after a
commit, the first member writes the save the strategy's policy asks for (a pure
function of the iteration: asking it there gives the controller's answer without a
round trip) and reports it in a ``saved`` event. :class:`ControllerSaves` is the
backend of the run's one :class:`~trainthrough.ft.checkpointer.Checkpointer`, in the
controller: advanced to a reported iteration, the Checkpointer asks the same policy
and ``save`` hands it rank 0's report, so counts, bytes, blocked seconds and
``checkpoint`` events are accounted there, whichever process was rank 0. On a restart
the controller chooses the checkpoint, once, and every new process loads exactly it.

The restart's perturbation (from the replica before the interrupted step to the state
restored) is measured by the first survivor, which holds the replica, against the
checkpoint it finds the controller will choose (the newest that verifies, by the same
:meth:`~trainthrough.ft.dp_checkpoint.ReplicaCheckpoint.latest`), and only the number
travels (:class:`~.messages.Before`): the replica is model-sized, and the store carries
control messages only. If the controller then chooses another checkpoint (one that
failed to verify in between), the perturbation is unknown (NaN), never wrong.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from trainthrough.config import RunConfig
from trainthrough.dp.batching import Cursor
from trainthrough.dp.rank import Replica, Tensors
from trainthrough.engines.gloo.messages import Before, Saved
from trainthrough.errors import CheckpointCorrupt, CheckpointWriteFailed
from trainthrough.ft.checkpoint import CheckpointStore
from trainthrough.ft.checkpointer import Checkpointer, Emit, SaveReport
from trainthrough.ft.decisions import CheckpointDecision
from trainthrough.ft.dp_checkpoint import Planned, ReplicaCheckpoint
from trainthrough.ft.host_snapshot import HostSnapshot
from trainthrough.ft.perturbation import perturbation
from trainthrough.ft.strategy import Strategy

LOAD_TRIES = 3  # a read error on the chosen checkpoint is retried, never worked around


def _saver(cfg: RunConfig, strategy: Strategy, url: str,
           template: Replica | None) -> ReplicaCheckpoint | None:
    if strategy.checkpoint == "none":
        return None
    return ReplicaCheckpoint(CheckpointStore(url, keep_last=cfg.checkpoint_keep), template)


class RankSaves:
    """A rank process's side: save when the policy says so, load what the controller chose.

    A synchronous save (checkpoint-restart) copies and writes before the next step.
    An asynchronous one (``persist=async``, checkpoint-async) copies the replica's
    state (to pinned host memory for a GPU replica, :mod:`~trainthrough.ft.host_snapshot`)
    and writes it on a background thread while training goes on; one write is in
    flight at a time (the next save waits for it, and that wait counts as blocked).
    Its ``saved`` report goes out from the training thread once the write finished
    (the store's client is not shared between threads), at the next commit or at
    :meth:`flush`.
    """

    def __init__(self, cfg: RunConfig, strategy: Strategy, url: str, replica: Replica,
                 every: int, post: Callable[[Saved], None]) -> None:
        """``every``: the checkpoint interval (``cfg.checkpoint_every`` resolved)."""
        self.policy, self.post = strategy.checkpoint_policy(every), post
        self.saver = _saver(cfg, strategy, url, replica)
        self.host = HostSnapshot()
        self._writing: threading.Thread | None = None
        self._done: Saved | None = None  # the finished write's report

    def after_commit(self, rank: Replica, logical: int, cursor: Cursor, members: list[int]) -> None:
        """The first member committed ``logical``: save now if the policy asks, and report."""
        if self._writing is not None and not self._writing.is_alive():
            self.flush()
        d = None if self.saver is None else self.policy.decide(logical)
        if self.saver is None or d is None:
            return
        t = time.perf_counter()
        self.flush()  # one write in flight: the snapshot's buffers are reused
        # A synchronous write ends before the next step: it reads the live state (a copy
        # of the model here would be one more model's memory at every save).
        p = self.saver.plan(rank, logical, cursor, members, copy=d.asynchronous)
        if not d.asynchronous:
            written = self._write(p)
            self.post(Saved(iteration=logical, payload=p.payload_bytes,
                            blocked_seconds=time.perf_counter() - t, **written))
            return
        snap = self.host.take(p.tensors)
        blocked = time.perf_counter() - t

        def write() -> None:
            written = self._write(replace(p, tensors=snap.tensors()))
            self._done = Saved(iteration=logical, payload=p.payload_bytes,
                               blocked_seconds=blocked, **written)

        self._writing = threading.Thread(target=write, name="checkpoint-write", daemon=True)
        self._writing.start()

    def save_now(self, rank: Replica, logical: int, cursor: Cursor, members: list[int]) -> None:
        """Write the save of ``logical`` now, whatever the policy says (the job is
        preempted: a just-in-time checkpoint), and report it as such (``jit``)."""
        if self.saver is None:
            return
        t = time.perf_counter()
        self.flush()
        p = self.saver.plan(rank, logical, cursor, members, copy=False)
        written = self._write(p)
        self.post(Saved(iteration=logical, payload=p.payload_bytes,
                        blocked_seconds=time.perf_counter() - t, jit=True, **written))

    def flush(self) -> None:
        """Wait for the write in flight, if any, and send its report."""
        if self._writing is None:
            return
        self._writing.join()
        self._writing, done, self._done = None, self._done, None
        if done is not None:
            self.post(done)

    def _write(self, p: Planned) -> dict[str, Any]:
        try:
            info = self.saver.write(p)  # type: ignore[union-attr]
            return {"bytes": info.nbytes, "name": info.name}
        except CheckpointWriteFailed as e:  # the run goes on; the previous save stays valid
            return {"error": str(e)}

    def restart_perturbation(self, before: Tensors, x0: Callable[[], Tensors] | None
                             ) -> tuple[int | None, float]:
        """The first survivor of a checkpoint-restart: ``(step, ||delta||)`` from
        ``before`` (its replica) to the checkpoint the controller will choose, the newest
        that verifies (``step`` None: none, back to ``x0``; NaN if ``x0`` is unknown).
        Corrupt checkpoints are skipped silently: the controller reports them as it
        chooses. A measurement that fails (the storage errs) is NaN: it never ends the
        run, whose restart reads the checkpoint again (and fails loudly if it must)."""
        try:
            r = self.saver.latest(lambda _: None) if self.saver is not None else None
            after = r.params if r is not None else (x0() if x0 is not None else None)
            return (r.step if r is not None else None), perturbation(before, after)[0]
        except Exception:  # noqa: BLE001 - a number in the summary, not the run's fate
            return None, float("nan")

    def load(self, step: int) -> tuple[Tensors, Cursor]:
        """Exactly the checkpoint of ``step``, which every peer loads too.

        Raises:
            RuntimeError: it cannot be read after :data:`LOAD_TRIES` attempts.
        """
        if self.saver is None:
            raise RuntimeError(f"told to load checkpoint {step} in a run that keeps none")
        error: Exception | None = None
        for attempt in range(LOAD_TRIES):
            time.sleep(0.2 * attempt)
            try:
                r = self.saver.load(step)
                return r.tensors, r.cursor
            except CheckpointCorrupt as e:
                error = e
        raise RuntimeError(f"cannot read checkpoint {step}, which the controller chose: {error}")


class ControllerSaves:
    """The controller's side: the run's Checkpointer (this is its backend), and the
    checkpoint a restart loads."""

    def __init__(self, cfg: RunConfig, strategy: Strategy, url: str, template: Replica | None,
                 every: int, emit: Emit) -> None:
        """``template``: a replica as the ranks build theirs (None: the controller of a
        user's own loop holds none), to verify the checkpoints' keys and shapes."""
        self.saver = _saver(cfg, strategy, url, template)
        self.checkpointer = Checkpointer(strategy.checkpoint_policy(every), self, emit)
        self._reports: dict[int, SaveReport] = {}
        self.before: Before | None = None  # the first survivor's measure of the restart
        #: the step of the just-in-time checkpoint written as the job was preempted
        #: (None: none was, or its write failed)
        self.jit: int | None = None

    def on_saved(self, m: Saved) -> None:
        """Rank 0 reported a save: the Checkpointer decides about every iteration up to it
        (a just-in-time save, which no policy asked for, is counted as such)."""
        report = SaveReport(m.bytes, m.payload, m.blocked_seconds,
                            [m.name] if m.name is not None else [], [m.error] if m.error else [])
        if m.jit:
            self.jit = m.iteration if m.name is not None else None
            self.checkpointer.saved_now(m.iteration, report, why="preempt")
            return
        self._reports[m.iteration] = report
        self.checkpointer.after_iteration(m.iteration)
        self._reports.clear()  # a report the policy did not ask for is not a checkpoint

    def save(self, d: CheckpointDecision, iteration: int,
             done: Callable[[SaveReport], None]) -> None:
        """The backend's call: the save exists if rank 0 reported it (a rank 0 that died
        while writing leaves nothing to count)."""
        if (report := self._reports.get(iteration)) is not None:
            done(report)

    def choose(self, on_corrupt: Callable[[str], None]) -> tuple[int | None, float]:
        """The checkpoint every restarted rank loads (None: x0), chosen once here; and
        the restart's perturbation as the first survivor measured it (:attr:`before`:
        NaN if none sent it, or it measured against another checkpoint)."""
        r = self.saver.latest(on_corrupt) if self.saver is not None else None
        step = r.step if r is not None else None
        self.checkpointer.rewind(step or 0)
        b, self.before = self.before, None
        return step, (b.perturbation if b is not None and b.step == step else float("nan"))
