"""A SIGTERM or Ctrl-C that lands while a rank process starts: the process is recorded
first (so the run's end ends it), then the interruption is raised."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from trainthrough.engines.gloo.procs import Procs
from trainthrough.errors import Terminated, interrupt, uninterrupted


class _Started:
    pid: int | None = 1

    exitcode = None

    def join(self, timeout: float | None = None) -> None: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...


def _sigterm_now() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the handler runs here, between two bytecodes of the launch


@pytest.fixture
def handler() -> Any:
    old = signal.signal(signal.SIGTERM, lambda *_: interrupt(Terminated()))
    yield
    signal.signal(signal.SIGTERM, old)


def test_a_sigterm_during_a_launch_is_raised_once_the_process_is_recorded(
        handler: Any) -> None:
    started: list[_Started] = []

    def launch(spec: Any) -> _Started:
        _sigterm_now()
        started.append(_Started())
        return started[-1]

    procs = Procs(store=None, base=None, launch=launch)  # type: ignore[arg-type]
    with pytest.raises(Terminated):
        procs.spawn(0, "fresh", attempt=0, executed=0, ctl=0, orders=[])
    assert [p.process for p in procs.started] == started  # recorded: the run's end ends it


def test_outside_a_launch_a_sigterm_is_raised_at_once(handler: Any) -> None:
    with pytest.raises(Terminated):
        _sigterm_now()
        pytest.fail("not interrupted")  # pragma: no cover


def test_nested_blocks_raise_once_at_the_outermost_end(handler: Any) -> None:
    reached = []
    with pytest.raises(Terminated), uninterrupted():
        with uninterrupted():
            _sigterm_now()
        reached.append("inner end")
    assert reached == ["inner end"]
    with uninterrupted():  # nothing held from before
        pass
