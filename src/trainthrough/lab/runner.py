"""Run one configuration end to end: validate, build, run, write the run folder.

This is the single entry point the CLI and the suites use, so every run, whatever
started it, writes the same folder and the same summary fields.
"""

from __future__ import annotations

import contextlib
import importlib
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from trainthrough.config import RunConfig, baseline_config
from trainthrough.engines.base import Engine, RunContext
from trainthrough.engines.callbacks import Callback, Callbacks
from trainthrough.engines.registry import canonical, check_resumable, entry, traits
from trainthrough.engines.result import RunResult, RunSummary, limits, new_result
from trainthrough.errors import UserError, original, reason, terminated
from trainthrough.faults.spec import parse
from trainthrough.ft.checkpoint import absolute_base, new_run_id, run_location
from trainthrough.ft.strategy import resolve
from trainthrough.lab.bound import IterateTracker, fit_contraction
from trainthrough.lab.recorder import RunRecorder
from trainthrough.lab.rework import Baseline, rework
from trainthrough.lab.run_folder import (
    CLI,
    Spelling,
    check_checkpoint_dir,
    check_out,
    clear,
    require_checkpoint,
)
from trainthrough.lab.validate import validate_run
from trainthrough.workloads import Workload, make_workload
from trainthrough.workloads.reference import absolute


def resolve_defaults(cfg: RunConfig) -> tuple[RunConfig, Workload]:
    """Fill the fields left to the workload, so ``config.toml`` is fully resolved
    (engine aliases resolved too: ``dist`` is recorded as ``gloo``)."""
    workload = make_workload(cfg.workload, seed=cfg.seed, **cfg.workload_options)
    # No interval where nothing is saved: a recorded one would be a setting the run
    # does not read, refused when config.toml is run again (engines/options.py).
    saves = resolve(cfg.strategy).checkpoint != "none"
    return replace(
        cfg, engine=canonical(cfg.engine), workload=absolute(cfg.workload),
        max_iterations=cfg.max_iterations or workload.default_max_iterations,
        eval_every=cfg.eval_every or workload.default_eval_every,
        checkpoint_every=(cfg.checkpoint_every or workload.default_checkpoint_every
                          if saves else None),
        target=cfg.target if cfg.target is not None else workload.default_target,
    ), workload


def build_engine(cfg: RunConfig, workload: Workload, callback: Callback,
                 checkpoint_url: str, resume: bool = False) -> Engine:
    """Build the run context once and hand it to the configured engine.

    ``cfg`` must already be resolved (:func:`resolve_defaults`): nothing downstream
    re-resolves the strategy or re-parses the failure specs. With ``resume`` the engine
    starts from the newest valid checkpoint in ``checkpoint_url`` instead of ``x0``
    (the engine must claim it: :func:`~trainthrough.engines.registry.check_resumable`).
    """
    engine, lim = canonical(cfg.engine), limits(cfg, workload)
    ctx = RunContext(cfg=cfg, workload=workload, strategy=resolve(cfg.strategy),
                     specs=parse(cfg.failures), limits=lim, callback=callback,
                     checkpoint_url=checkpoint_url,
                     result=new_result(cfg, workload, engine, lim.target), engine=engine,
                     resume=resume)
    module, _, name = entry(engine).factory_for(cfg.paradigm).partition(":")
    factory = getattr(importlib.import_module(module), name)
    return factory(ctx)  # type: ignore[no-any-return]


def _memory_exists(url: str) -> bool:
    import fsspec

    return bool(fsspec.filesystem("memory").exists(url[len("memory://"):]))


def _drop_memory_location(url: str) -> None:
    """Free one in-memory location (memory:// lives as long as the process)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    path = url[len("memory://"):]
    if fs.exists(path):
        fs.rm(path, recursive=True)


@contextlib.contextmanager
def _scratch_checkpoints(engine: str) -> Iterator[str]:
    """A checkpoint location for a run without a folder, removed when the run is over.

    Only what this function created is removed, by the object that created it: a
    folder the project did not make (a user's ``--checkpoint-dir``, whatever its
    name) is never deleted.
    """
    if not traits(engine).hosts_processes:  # all in this process: memory is enough
        base = f"memory://trainthrough/{uuid.uuid4().hex}"
        try:
            yield run_location(base, new_run_id())
        finally:
            _drop_memory_location(base)
        return
    # Real engines' actors run in other processes: they need a real path, not memory.
    with tempfile.TemporaryDirectory(prefix="tt-ckpt-", ignore_cleanup_errors=True) as base:
        yield run_location(base, new_run_id())


def run_silent(cfg: RunConfig, callback: Callback | None = None) -> RunResult:
    """Run without a folder (baselines, quick checks); checkpoints are temporary."""
    with _scratch_checkpoints(cfg.engine) as url:
        resolved, workload = resolve_defaults(cfg)
        return build_engine(resolved, workload, callback or Callback(), url).run()


def run_baseline(cfg: RunConfig) -> Baseline:
    """The failure-free twin of ``cfg``: iterations to target and the fitted contraction.

    It runs 50% past the target so its last iterate is a better stand-in for ``x*``
    when fitting ``c`` (lab/bound.py); iterations to target are unaffected.
    """
    tracker = IterateTracker()
    s = run_silent(replace(baseline_config(cfg), past_target=0.5), tracker)
    return Baseline(s.iterations_to_target, fit_contraction(tracker.iterations, tracker.iterates))


def run(cfg: RunConfig, out: Path, callbacks: list[Callback] | None = None,
        baseline: Baseline | None = None, run_id: str | None = None,
        overwrite: bool = False, resume: bool = False,
        names: Spelling = CLI) -> RunSummary:
    """Run ``cfg`` and write its folder ``out``; return its summary.

    The run's checkpoints go to ``<checkpoint dir>/run-<run id>/``: runs sharing a
    checkpoint folder never list, load or prune each other's checkpoints. The id is
    in ``summary.json`` (``run_id``, ``checkpoint_url``) and ``status.json``.

    The folder says at every moment what it holds (lab/recorder.py): ``status.json``
    is ``running`` from the start, ``interrupted`` (Ctrl-C, SIGTERM) or ``failed``
    (any error, with its reason) if the run ends early, and ``summary.json`` exists
    only once it finished.

    Args:
        cfg: the configuration (validated here); with ``resume``, the recorded one.
        out: the run folder; must not exist or be empty, unless ``overwrite`` or
            ``resume`` (rules: :mod:`trainthrough.lab.run_folder`).
        callbacks: extra hooks (progress bars, live plots).
        baseline: what :func:`run_baseline` returned for this config, when the caller
            already has it (suites share one per seed); otherwise computed here if
            ``cfg.baseline`` is set.
        run_id: the run's identity; a fresh one by default. A resumed run passes the
            id it had, to find its own checkpoints again.
        overwrite: replace the run already in ``out`` (only the files a run writes).
        resume: continue the incomplete run in ``out`` from its newest valid
            checkpoint (its id: ``run_id``, else the one ``out`` records); its logs
            are appended to.
        names: how the caller spells ``out``, ``overwrite``, ``resume`` and the
            checkpoint folder, in the messages that refuse them (the command line's
            flags by default; ``launch`` passes its own arguments' names).

    Raises:
        UserError: invalid configuration, an ``out`` folder already in use, or a run
            that cannot be resumed (see :func:`~trainthrough.lab.run_folder.check_out`
            and :func:`~trainthrough.engines.registry.check_resumable`).
    """
    validate_run(cfg)
    if overwrite and resume:
        raise UserError(f"{names.overwrite} and {names.resume} exclude each other: replace "
                        "the run, or continue it")
    if resume:
        check_resumable(cfg.engine, cfg.paradigm, resolve(cfg.strategy))
    previous = check_out(out, overwrite=overwrite, resume=resume, names=names)
    if cfg.checkpoint_dir:  # the default, inside ``out``, is checked with it
        check_checkpoint_dir(cfg.checkpoint_dir, names)
    if resume and previous is not None:
        run_id = run_id or previous.run_id
    base = absolute_base(cfg.checkpoint_dir or str(out / "checkpoints"))
    run_id = run_id or new_run_id()
    try:
        url = run_location(base, run_id)
    except ValueError as e:
        raise UserError(str(e)) from None
    if resume:
        newest = require_checkpoint(out, url, names)
        # Resumed past its budget, a run would train on (or stop before a step that is
        # already done): refused. A resumed config is the recorded one, budget resolved.
        if cfg.max_iterations is not None and cfg.max_iterations < newest:
            raise UserError(f"{names.resume}: the newest checkpoint of the run in {out} is "
                            f"at step {newest}, past {names.max_iterations} "
                            f"{cfg.max_iterations}: give a budget of at least {newest}, or "
                            f"add {names.overwrite} instead to run it again")
    # In memory, checkpoints outlive the run only as a leak (suites run hundreds): what
    # the run created goes when it ends (the folder if new, else its own location).
    drop = None
    if url.startswith("memory://") and not _memory_exists(url):
        drop = url if _memory_exists(base) else base
    resolved, workload = resolve_defaults(cfg)
    # The folder, not this run's location in it: the config re-run as is is a new run.
    resolved = replace(resolved, checkpoint_dir=base)
    recorder: RunRecorder | None = None
    try:
        # Build before touching the disk: bad sizes or ids fail without a folder.
        holder = Callbacks(list(callbacks or []))
        engine = build_engine(resolved, workload, holder, url, resume=resume)
        if previous is not None and overwrite:
            clear(previous, names)
        recorder = RunRecorder(out, resolved.to_toml(), run_id, append=resume)
        holder.items.insert(0, recorder)
        result = engine.run()
        if baseline is None and cfg.baseline:
            baseline = run_baseline(cfg)
        summary = RunSummary(result, run_id, url, rework(result, baseline))
        recorder.write_summary(summary)
        holder.after_run(summary)
        return summary
    except KeyboardInterrupt as e:
        if recorder is not None and not recorder.finished:
            recorder.mark("interrupted", "terminated (SIGTERM)" if terminated(e)
                          else "interrupted (SIGINT, Ctrl-C)")
        raise
    except BaseException as e:
        if recorder is not None and not recorder.finished:
            recorder.mark("failed", _reason(e))
        raise
    finally:
        if recorder is not None:
            recorder.close()
        if drop is not None:
            _drop_memory_location(drop)


def _reason(e: BaseException) -> str:
    return f"{type(original(e)).__name__}: {reason(e)}"

