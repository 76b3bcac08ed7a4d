"""Independent runs on a few processes, or inline: what suites and sim checks share.

Each run is single-threaded and deterministic (sim's clock is simulated), so running
several at a time changes when they finish, never what they compute.
Runs on a real engine, whose clock is the wall's, go inline (``jobs=1``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from trainthrough.engines.forked import take_place

#: What the fork server imports once, before it forks a single worker: the runner and,
#: with it, torch and every engine's sim path (~2.5 s of CPU a process).
PRELOAD = ["trainthrough.lab.runner"]


class _Inline:
    """An executor that runs each job at once in this process (jobs=1: Ray suites
    share one Ray session instead of starting one per run)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn: Any, *args: Any) -> _Lazy:
        return _Lazy(fn, args)


class _Lazy:
    """A job run when its result is asked for, so progress advances run by run."""

    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def result(self) -> Any:
        return self.fn(*self.args)


class _Forked:
    """Workers forked from this process's fork server, each job run where its caller is.

    Not a fork of the caller: a forked torch with an initialised thread pool can
    deadlock. The fork server is a fresh interpreter that imports :data:`PRELOAD` and
    runs no tensor operation, started once per process (multiprocessing keeps it), so
    every pool's workers start in milliseconds instead of each importing torch again,
    as ``spawn`` made them (two workers a suite: ~5 s of CPU per suite, per ``compare``).
    What a fork does not carry, each job brings: the caller's working folder and
    environment when it was submitted (the server keeps those of its own start)."""

    def __init__(self, jobs: int) -> None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)  # read when the server starts, once
        self._pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)

    def __enter__(self) -> _Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=exc[0] is not None)

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        return self._pool.submit(_as_caller, os.getcwd(), dict(os.environ), fn, args)


def _as_caller(cwd: str, env: dict[str, str], fn: Any, args: tuple[Any, ...]) -> Any:
    """In a worker: ``fn`` where and as its caller would have run it."""
    take_place(cwd, env)
    return fn(*args)


def job_pool(jobs: int) -> _Forked | _Inline:
    return _Inline() if jobs == 1 else _Forked(jobs)
