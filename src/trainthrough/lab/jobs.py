"""Independent runs on a few processes, or inline: what suites and sim checks share.

Each run is single-threaded and deterministic (sim's clock is simulated), so running
several at a time changes when they finish, never what they compute.
Runs on a real engine, whose clock is the wall's, go inline (``jobs=1``).
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from typing import Any


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


def job_pool(jobs: int) -> ProcessPoolExecutor | _Inline:
    if jobs == 1:
        return _Inline()
    # spawn, not fork: a forked torch with an initialised thread pool can deadlock.
    return ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))
