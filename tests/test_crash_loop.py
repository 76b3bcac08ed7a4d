"""Failures nobody injected, without processes: the restart budget's decisions, how
the controller names a lost rank's cause and ends a crash loop, the exception a
caller gets back, and the heartbeat watch."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest
import torch.distributed as dist

from trainthrough.engines.gloo.crashes import Crashes
from trainthrough.engines.gloo.liveness import Watch, beat_key
from trainthrough.engines.gloo.messages import RankError
from trainthrough.errors import RankFailed, RunStalled, rebuilt
from trainthrough.ft.crash_loop import CrashAction, CrashLoopPolicy, Unexpected


def test_a_failure_is_recovered_max_restarts_times_in_a_row_then_the_run_gives_up() -> None:
    policy = CrashLoopPolicy(max_restarts=2)
    boom = Unexpected("ValueError: boom", 7)
    assert policy.decide([], boom) == (d := policy.decide([], boom))
    assert d.action is CrashAction.RECOVER and d.times == 1
    assert policy.decide([boom], boom).action is CrashAction.RECOVER
    give_up = policy.decide([boom, boom], boom)
    assert give_up.action is CrashAction.GIVE_UP and give_up.times == 3
    # The run got further, or another error came, in between: a new streak.
    assert policy.decide([boom, Unexpected("ValueError: boom", 8), boom], boom).times == 2
    assert policy.decide([boom, boom], Unexpected("OSError: disk", 7)).times == 1
    assert CrashLoopPolicy(0).decide([], boom).action is CrashAction.GIVE_UP


@dataclass
class _Child:
    why: str = ""
    code: int | None = None

    @property
    def exitcode(self) -> int | None:
        return self.code


@dataclass
class _Proc:
    slot: int
    inc: int
    process: _Child
    silent_since: float | None = None

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode


def test_a_lost_rank_is_named_by_its_own_error_else_by_how_it_ended() -> None:
    c = Crashes(max_restarts=1)
    event = c.on_error(RankError(slot=1, inc=2, error="ValueError: bad batch",
                                 type_name="builtins.ValueError", message="bad batch",
                                 logical=5, traceback="Traceback ...\nValueError: bad batch"))
    assert event.to_record()["type"] == "rank-error" and event.traceback.startswith("Traceback")
    assert c.cause(_Proc(1, 2, _Child(code=1))).error == "ValueError: bad batch"
    # An earlier incarnation's error is not this one's.
    assert c.cause(_Proc(1, 3, _Child(code=1))).error == "its process ended with exit code 1"
    assert c.cause(_Proc(0, 0, _Child(code=-9))).error == "killed by SIGKILL"
    assert c.cause(_Proc(0, 0, _Child(code=-9, why="its node died"))).error == \
        "killed by SIGKILL (its node died)"
    assert "heartbeat stopped" in c.cause(_Proc(0, 0, _Child(), silent_since=1.0)).error
    assert c.cause(_Proc(0, 0, _Child()), hung=True).error.startswith("hung:")


def test_a_crash_loop_ends_with_the_ranks_error_in_one_line() -> None:
    c = Crashes(max_restarts=1)
    c.on_error(RankError(slot=1, inc=0, error="ValueError: bad batch",
                         type_name="builtins.ValueError", message="bad batch", logical=5))
    c.on_error(RankError(slot=1, inc=1, error="ValueError: bad batch",
                         type_name="builtins.ValueError", message="bad batch", logical=5))
    died = c.cause(_Proc(0, 0, _Child(code=-9)))
    c.judge([died, c.cause(_Proc(1, 0, _Child(code=1)))], step=3)  # recovered once
    with pytest.raises(RankFailed) as caught:
        c.judge([c.cause(_Proc(1, 1, _Child(code=1)))], step=3)
    e = caught.value
    assert str(e) == ("rank 1: ValueError: bad batch (at step 5; 2 times in a row, never "
                      "past step 5; max_restarts 1; its traceback is in events.jsonl)")
    assert (e.slot, e.type_name, e.message, e.step, e.times) == (
        1, "builtins.ValueError", "bad batch", 5, 2)
    assert isinstance(e, RunStalled)  # the command line: one line, exit status 1
    again = pickle.loads(pickle.dumps(e))  # it crosses processes (a Ray driver's caller)
    assert str(again) == str(e) and again.times == 2


def test_a_loop_that_gets_one_step_further_each_time_is_stuck_all_the_same() -> None:
    """A model too big for a message: the first rank dies posting it at step 0, the
    survivor goes on alone, commits step 0 and dies posting it at step 1; the group
    restarts from step 0. The failing step alternates; the run never gets past 1."""
    c = Crashes(max_restarts=3)
    lost = "torch.distributed.DistNetworkError: Connection reset by peer"
    failures = [(inc, slot) for inc in range(3) for slot in (0, 1)][:5]
    for n, (inc, slot) in enumerate(failures, start=1):
        c.on_error(RankError(slot=slot, inc=inc, error=lost, logical=slot,
                             type_name="torch.distributed.DistNetworkError",
                             message="Connection reset by peer"))
        causes = [c.cause(_Proc(slot, inc, _Child(code=1)))]
        if n < 5:  # the first at step 0 (the run no further than 0), then 4 at 1
            c.judge(causes, step=slot)
            continue
        with pytest.raises(RankFailed, match=r"^rank 0: torch\.distributed\.DistNetworkError: "
                                             r"Connection reset by peer \(at step 0; 4 times "
                                             r"in a row, never past step 1; max_restarts 3"):
            c.judge(causes, step=slot)
    # Once the run got past that step, the same error starts a new streak.
    c2 = Crashes(max_restarts=1)
    c2.judge([c2.cause(_Proc(0, 0, _Child(code=-9)))], step=1)
    c2.judge([c2.cause(_Proc(0, 1, _Child(code=-9)))], step=9)
    assert len(c2.streak) == 1


def test_a_caller_gets_a_builtin_exception_back_by_name_and_anything_else_named() -> None:
    def failed(type_name: str, message: str = "bad batch") -> RankFailed:
        return RankFailed("rank 1: ...", 1, type_name, message, 5, 4)

    e = failed("builtins.ValueError")
    mine = rebuilt(e)
    assert type(mine) is ValueError and str(mine) == "bad batch" and mine.__cause__ is e
    assert type(rebuilt(failed("builtins.KeyError", "'x'"))) is KeyError
    for other in ("mylib.errors.ValueError", "builtins.KeyboardInterrupt",
                  "builtins.UnicodeDecodeError", "builtins.nope", ""):
        out = rebuilt(failed(other))
        assert isinstance(out, RankFailed) and out.type_name == other


@dataclass
class _Live:
    slot: int
    inc: int
    exitcode: int | None = None


def test_the_watch_names_a_process_whose_heartbeat_stopped_and_spares_one_not_started() -> None:
    store = dist.HashStore()
    watch = Watch(store, timeout=3.0, period=1.0)
    beating, stopped, starting, ended = _Live(0, 0), _Live(1, 0), _Live(2, 0), _Live(3, 0, 1)
    procs = [beating, stopped, starting, ended]
    for p in (beating, stopped, ended):
        store.add(beat_key(p.slot, p.inc), 1)
    assert watch.silent(procs, now=100.0) == []
    assert watch.silent(procs, now=100.5) == []  # between two looks: nothing is read
    store.add(beat_key(0, 0), 1)
    assert watch.silent(procs, now=102.0) == []
    store.add(beat_key(0, 0), 1)
    assert watch.silent(procs, now=103.0) == [(stopped, 100.0)]
    # A new incarnation of a slot beats on a key of its own.
    assert watch.silent([_Live(1, 1)], now=110.0) == []
