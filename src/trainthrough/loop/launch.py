"""Starting a user's loop on ranks: :func:`launch`, the driver's side.

``launch`` is ``trainthrough run --paradigm dp --workload <file.py:train>`` from Python:
the same config, the same run folder (config, metrics, events, summary), the same
controller (:mod:`trainthrough.engines.gloo.controller`) with its recovery policies;
only the program the ranks run is the user's.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainthrough.config import CostModel, RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.result import RunSummary
from trainthrough.errors import RankFailed, UserError, rebuilt
from trainthrough.events import Record, Recovery
from trainthrough.workloads.user_loop import TrainingLoop


@dataclass
class LoopResult:
    """What a launched loop did: the first rank's return value and the run's summary.

    ``committed``: every committed step as ``[logical, attempt, members]``, which says
    which ranks (group members) trained on each global batch.
    """

    returned: Any
    summary: RunSummary
    out: Path
    committed: list[list[Any]] = field(default_factory=list)

    @property
    def recoveries(self) -> list[Recovery]:
        return list(self.summary.result.recoveries)

    def __str__(self) -> str:
        s = self.summary.result
        recs = ", ".join(f"{r.action} of {'+'.join(r.failed)} at step {r.at_iteration} "
                         f"in {r.recovery_seconds:.2f} s" for r in self.recoveries)
        return (f"{s.failures} failure(s), {len(self.committed)} steps committed, "
                f"{s.wall_seconds:.1f} s; recoveries: {recs or 'none'}; "
                f"returned {self.returned!r}; run folder {self.out}")


class _Narrator(Callback):
    """One line on stderr per evaluation and per failure, detection, recovery and join."""

    WORDS = {"failure": "rank {ids} killed at step {iteration} ({phase_kind})",
             "detection": "  detected in {detection_seconds:.3f} s; survivors {survivors}",
             "recovery": "  recovered by {action} in {recovery_seconds:.2f} s",
             "rank-joined": "  rank {slots} joined again in {join_seconds:.2f} s",
             "restored": "  restarting from checkpoint step {step}"}

    def __init__(self, metric: str) -> None:
        self.metric = metric

    def after_eval(self, record: dict[str, Any]) -> None:
        print(f"step {record['iteration']:>5}  {self.metric} {record['metric']:.4f}  "
              f"({record['wall_seconds']:.1f} s)", file=sys.stderr, flush=True)

    def on_event(self, event: Record) -> None:
        words = self.WORDS.get(str(event.get("type")))
        if words is not None:
            try:
                print(words.format(**event), file=sys.stderr, flush=True)
            except (KeyError, ValueError):
                print(f"  {event['type']}", file=sys.stderr, flush=True)


def reference_of(train: TrainingLoop) -> str:
    """How every rank imports ``train``: its file (a script) or its module.

    Raises:
        UserError: ``train`` is not marked, not defined at the top level of a module,
            or has no file (``python -c``, a notebook cell).
    """
    if not isinstance(train, TrainingLoop):
        raise UserError("launch() takes a function marked with @training_loop")
    fn = train.fn
    if "<locals>" in fn.__qualname__ or fn.__qualname__ != fn.__name__:
        raise UserError(f"define {fn.__name__} at the top level of its file: every rank "
                        "imports it from there")
    module = sys.modules.get(fn.__module__)
    if fn.__module__ != "__main__":
        return f"{fn.__module__}:{fn.__name__}"
    path = getattr(module, "__file__", None)
    if not path:
        raise UserError("the training loop has no file (python -c or a notebook): put it in "
                        "a .py file, which every rank imports")
    return f"{Path(path).resolve()}:{fn.__name__}"


def _as_recorded(cfg: RunConfig, folder: Path) -> RunConfig:
    """The recorded configuration of the run in ``folder``, with what a resume may
    change taken from ``cfg`` (:data:`trainthrough.lab.resume.FREE_ON_RESUME`).

    Raises:
        UserError: nothing to resume there, or ``cfg`` trains differently (one line
            naming the first setting that differs).
    """
    from trainthrough.lab.resume import conflict, resumed_config
    from trainthrough.lab.run_folder import PYTHON, resume_point

    recorded = resume_point(folder, PYTHON).config
    bad = conflict(recorded, cfg)
    if bad is not None:
        raise UserError(f"launch(resume=True): the run in {folder} trained with "
                        f"{bad.setting} = {bad.recorded!r}, not {bad.asked!r}; resume it with "
                        "the same arguments, or start a new run (overwrite=True)")
    return resumed_config(recorded, cfg)


def launch(train: TrainingLoop, *, ranks: int = 2, strategy: str = "rollback",
           fail: str | Sequence[str] = (), seed: int = 0, engine: str = "ray",
           ray_address: str | None = None, out: str | Path | None = None,
           replace: bool = True, recovery_delay: float = 2.0,
           checkpoint_every: int | None = None, checkpoint_dir: str | None = None,
           checkpoint_shared: bool = False, bind_address: str | None = None,
           timeout: float = 5.0,
           wall_limit: float | None = None, elastic: str = "keep-global",
           sync_every: int | None = None, overwrite: bool = False, progress: bool = True,
           micro_batches: int = 1, resume: bool = False, allreduce_buckets: int | None = None,
           options: Mapping[str, Any] | None = None,
           max_restarts: int = RunConfig.max_restarts,
           liveness_timeout: float = RunConfig.liveness_timeout,
           straggler_deadline: float | None = None) -> LoopResult:
    """Run ``train(loop, **options)`` on ``ranks`` ranks until its epochs are done.

    Args:
        options: your loop's own arguments: every rank calls ``train(loop, **options)``.
            They are the parameters of ``train`` after ``loop``, checked against its
            signature before anything starts (a name it does not take, or a value of
            another type than its annotation, is refused in one line); numbers,
            strings, booleans and lists of them, recorded in the run's ``config.toml``
            (``workload_options``) and required the same on ``resume``. From the
            command line: ``--option name=value``.
        ranks: data-parallel ranks (each a process on a Ray node, or a local process with
            ``engine="gloo"``).
        strategy: how a lost rank is recovered: ``rollback`` (redo the step on the
            survivors), ``lossy-forward``, ``checkpoint-restart``; or relaxed: ``localsgd``,
            ``diloco``, ``streaming-diloco``, where your optimizer is the inner one and a
            lost rank takes only its local steps along (``trainthrough list``).
        fail: failures to inject, in the spec language of ``trainthrough run --fail``
            (``rank=1@iter=30``: rank 1 is SIGKILLed at its 30th step); one spec may be
            given as a plain string.
        engine: ``ray`` (local Ray, or the cluster at ``ray_address``) or ``gloo``.
        replace: start a replacement for a lost rank ``recovery_delay`` seconds later; it
            joins with a live peer's state (the group shrinks, then grows back).
        timeout: the collective timeout in seconds: how long a rank waits for its peers
            in a collective before it reports them lost (a hung rank stalls the group that
            long), and so the longest the first rank may spend evaluating or saving
            between two steps while the others wait for it.
        liveness_timeout: seconds a rank process's heartbeat may stop before it is taken
            for dead (a stopped or frozen process). It beats from a thread, so a long
            step or evaluation never counts.
        straggler_deadline: seconds the ranks wait for each other in a step's
            collective before they commit it without the ones that have not come, which
            are replaced (None: they wait, up to ``timeout``, which it must be below).
        max_restarts: how many times in a row a failure you did not inject may repeat
            the same way (the same error, the run no further) and be recovered; the next
            ends the run with that error (0: the first one does).
        micro_batches: gradient accumulation: each rank's batch (the ``DataLoader``'s
            ``batch_size``) is cut into this many micro-batches, each a forward and
            backward of its own, and one update follows their averaged gradient.
        allreduce_buckets: the gradient is averaged in this many equal buckets
            (``--allreduce-buckets``); by default (None) in buckets of 25 MB, as DDP's,
            each started as soon as the backward has filled it.
            ``fail="rank=1@iter=50,phase=allreduce:2"`` strikes after bucket 2, so it
            needs at least 3 (fewer is refused before anything starts).
        checkpoint_dir: where checkpoints go (a path or an fsspec URL); a
            ``checkpoint-restart`` on a cluster (``ray_address``) needs one every host
            reaches: a URL of shared storage, or a folder every host mounts with
            ``checkpoint_shared=True``.
        bind_address: the address of this machine the run's store listens on (default
            127.0.0.1; with ``ray_address``, this machine's address on the cluster).
        sync_every: relaxed strategies: H, your steps between two outer steps
            (default 10); refused with any other strategy.
        out: the run folder (default ``runs/loop-<time>``); one that holds a run is
            refused unless ``overwrite`` (only the files a run writes are replaced).
        resume: continue the run in ``out`` that died whole (no summary) from its
            newest checkpoint: the model, optimizer, data position and every registered
            state, on every rank. The other arguments must be those it ran with,
            ``checkpoint_dir`` included (``fail`` and ``wall_limit`` may differ: the
            failures are the resumed run's own, those due at or before the checkpoint
            are skipped; lab/resume.py). Needs a strategy
            that keeps checkpoints (``checkpoint-restart``).

    Raises:
        UserError: a bad argument (one line says which, by the name it has here), or a
            rank's loss or gradient is not finite.
        Exception: your loop's own error, once it repeated ``max_restarts`` times more
            (or came while the ranks were starting): an exception of the same class
            with its message when the class is one of Python's builtin ones
            (``ValueError``, ``KeyError``, ``RuntimeError``, ...), else a
            :class:`~trainthrough.errors.RankFailed` whose ``type_name`` and
            ``message`` say what it was. Either way the run's ``RankFailed`` is its
            ``__cause__`` (one line: rank, error, step, how often), and the traceback is
            in the run folder's ``events.jsonl`` (``rank-error``).
    """
    from trainthrough.ft.strategy import resolve
    from trainthrough.lab import runner
    from trainthrough.lab.run_folder import PYTHON

    if sync_every is not None and not resolve(strategy).relaxed:
        raise UserError(f"sync_every applies to localsgd, diloco and streaming-diloco, not "
                        f"strategy {strategy!r}: drop it")
    ref = reference_of(train)
    folder = Path(out) if out is not None else Path("runs") / time.strftime("loop-%Y%m%d-%H%M%S")
    failures = [fail] if isinstance(fail, str) else list(fail)
    cfg = RunConfig(workload=ref, paradigm="dp", engine=engine, ranks=ranks, strategy=strategy,
                    failures=failures, seed=seed, ray_address=ray_address, replace=replace,
                    recovery_delay=recovery_delay, checkpoint_every=checkpoint_every,
                    checkpoint_dir=checkpoint_dir, checkpoint_shared=checkpoint_shared,
                    bind_address=bind_address, micro_batches=micro_batches,
                    elastic=elastic, wall_limit=wall_limit,
                    allreduce_buckets=allreduce_buckets,
                    workload_options=dict(options or {}),
                    max_restarts=max_restarts, liveness_timeout=liveness_timeout,
                    straggler_deadline=straggler_deadline,
                    cost=CostModel(timeout_seconds=timeout),
                    sync_every=RunConfig.sync_every if sync_every is None else sync_every)
    if resume:
        cfg = _as_recorded(cfg, folder)
    callbacks: list[Callback] = [_Narrator(train.metric)] if progress else []
    try:
        summary = runner.run(cfg, folder, callbacks=callbacks, overwrite=overwrite,
                             resume=resume, names=PYTHON)
    except RankFailed as e:
        # Your exception's own class where it can be made from its name and message
        # (the rank's object never crosses: nothing is unpickled).
        mine = rebuilt(e)
        if mine is e:
            raise
        raise mine from e
    extras = summary.result.extras  # the controller's (engines/gloo/controller.py)
    return LoopResult(extras.get("returned"), summary, folder, list(extras.get("committed", [])))
