"""Liveness and failure handling of the data-parallel controller on real gloo ranks.

A rank that computes is never taken for hung, however long its step or its evaluation;
a rank that truly hangs is found by its peers' collective timeout; a failure that
repeats the same way ends the run with the rank's own error; SIGTERM ends a run
cleanly. Each test is a user's loop (tests/loops/live_loop.py) on 2 gloo ranks, a few
seconds long.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.loops.live_loop import train
from trainthrough import events
from trainthrough.config import CostModel, RunConfig
from trainthrough.engines.signals import identify
from trainthrough.errors import RankFailed
from trainthrough.lab.runner import run
from trainthrough.loop import launch

ROOT = Path(__file__).resolve().parents[1]
LOOP = ROOT / "tests" / "loops" / "live_loop.py"
pytestmark = pytest.mark.timeout(180)


def _events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]


def _launch(out: Path, **kw: Any) -> Any:
    args: dict[str, Any] = dict(ranks=2, engine="gloo", strategy="rollback", out=out,
                                progress=False, recovery_delay=0.2, timeout=5.0)
    return launch(train, **{**args, **kw})


def test_a_step_longer_than_the_liveness_timeout_is_not_taken_for_a_hang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank's loss sleeps 3x the liveness timeout in one step, and the first
    rank's evaluations take longer than that timeout too: no event comes for seconds,
    yet the ranks beat, and the run ends failure-free."""
    liveness = 1.5
    monkeypatch.setenv("TT_STEP_SLEEP", f"{3 * liveness}@3")
    monkeypatch.setenv("TT_EVAL_SLEEP", f"{1.2 * liveness}@4")
    r = _launch(tmp_path / "run", liveness_timeout=liveness, timeout=10.0)
    kinds = [e["type"] for e in _events(tmp_path / "run")]
    assert r.summary.result.failures == 0 and "rank-silent" not in kinds, kinds
    assert r.returned["steps"] == 8 and r.summary.result.extras["replicas_identical"]


def test_a_rank_that_hangs_is_found_by_the_collective_timeout_and_recovered(
        tmp_path: Path) -> None:
    """Rank 1 stops itself (SIGSTOP) at step 3: its peer's collective times out, the
    controller fences it a grace later (not a second timeout later), and the survivor
    goes on."""
    timeout = 2.0
    r = _launch(tmp_path / "run", fail="rank=1@iter=3,mode=hang", timeout=timeout)
    ev = _events(tmp_path / "run")
    fail = next(e for e in ev if e["type"] == "failure")
    det = next(e for e in ev if e["type"] == "detection")
    assert fail["mode"] == "hang" and det["failed"] == ["rank1"]
    assert det["detection_seconds"] >= timeout  # its peer found it by the timeout
    # Decided a grace after the timed-out report: the wait for a rank that may still
    # be computing (a second collective timeout) is not spent on one the group waited for.
    assert det["wall_seconds"] - fail["wall_seconds"] < 2 * timeout
    assert r.summary.result.failures == 1 and len(r.recoveries) == 1
    assert r.returned["steps"] == 8


def test_a_stopped_rank_is_found_by_its_silent_heartbeat_before_any_timeout(
        tmp_path: Path) -> None:
    """Rank 1 stops itself at step 3 and its peer would wait 30 s in the collective:
    the stopped process's heartbeat stops too, and the liveness timeout (2 s) ends it
    first; its peer's collective then fails at once and the run recovers."""
    r = _launch(tmp_path / "run", fail="rank=1@iter=3,mode=hang", timeout=30.0,
                liveness_timeout=2.0)
    ev = _events(tmp_path / "run")
    silent = [e for e in ev if e["type"] == "rank-silent"]
    det = next(e for e in ev if e["type"] == "detection")
    assert [e["slot"] for e in silent] == [1] and silent[0]["silent_seconds"] >= 2.0
    assert det["failed"] == ["rank1"] and det["detection_seconds"] < 30.0
    assert r.summary.result.failures == 1 and r.returned["steps"] == 8


def test_a_rank_evaluating_when_its_group_changes_is_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first rank evaluates after every step (1 s, twice the old grace); rank 2
    is lost and its replacement joins, so the group stops after a step to take it in:
    rank 1 reports at once, rank 0 once its evaluation is done. Taking it for hung then (what the controller did) turned every
    join into a new failure: the issue's endless restarts. Only the injected failure
    may count."""
    monkeypatch.setenv("TT_EVAL_SLEEP", "1.0")
    monkeypatch.setenv("TT_EPOCHS", "2")  # 10 steps: the replacement joins before the end
    cfg = RunConfig(workload=f"{LOOP}:train", paradigm="dp", engine="gloo", ranks=3,
                    strategy="rollback", failures=["rank=2@iter=1"], recovery_delay=0.5,
                    eval_every=1, cost=CostModel(timeout_seconds=5.0))
    s = run(cfg, tmp_path / "run")
    assert (s.result.failures, s.result.extras["ranks_joined"]) == (1, 1)
    assert [e["type"] for e in _events(tmp_path / "run")].count("detection") == 1


def test_checkpoint_restart_with_a_slow_evaluation_ends_with_the_failure_free_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's run, smaller: checkpoint-restart, a checkpoint every 2 steps, an
    evaluation every 2 that takes a second, rank 1 killed at step 5. The group restarts
    from step 4 once, and ends where the run without a failure ends, bit for bit."""
    monkeypatch.setenv("TT_EVAL_SLEEP", "1.0")
    r = _launch(tmp_path / "run", strategy="checkpoint-restart", fail="rank=1@iter=5",
                checkpoint_every=2)
    monkeypatch.setenv("TT_EVAL_SLEEP", "0")
    clean = _launch(tmp_path / "clean", strategy="checkpoint-restart", checkpoint_every=2)
    assert r.summary.result.failures == 1 and r.summary.result.extras["restarts"] == 1, r.summary
    assert r.returned == clean.returned and r.returned["steps"] == 8


def test_a_rank_error_that_repeats_ends_the_run_with_that_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 raises at step 2 in every incarnation: recovered max_restarts times,
    then the run ends with the rank's own exception, its traceback in events.jsonl."""
    monkeypatch.setenv("TT_RAISE_AT", "2")
    with pytest.raises(ValueError, match="^bad batch at step 2$") as caught:
        _launch(tmp_path / "run", strategy="checkpoint-restart", checkpoint_every=1,
                max_restarts=1)
    failed = caught.value.__cause__
    assert isinstance(failed, RankFailed) and failed.times == 2 and failed.step == 2
    assert str(failed).startswith("rank 1: ValueError: bad batch at step 2 (at step 2; 2 "
                                  "times in a row, never past step 2; max_restarts 1")
    records = _events(tmp_path / "run")
    for record in records:  # the schema of docs/events.md, exactly
        events.parse(record, strict=True)
    errors = [e for e in records if e["type"] == "rank-error"]
    assert len(errors) == 2 and "raise kind(" in errors[0]["traceback"]
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "failed" and "ValueError: bad batch" in status["reason"]


def test_an_error_of_a_class_of_your_own_comes_back_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TT_RAISE_AT", "1")
    monkeypatch.setenv("TT_RAISE", "own")
    with pytest.raises(RankFailed, match=r"^rank 1: tests\.loops\.live_loop\.OwnError: bad "
                                         r"batch at step 1 \(at step 1; 1 time in a row") as caught:
        _launch(tmp_path / "run", max_restarts=0)
    assert caught.value.type_name == "tests.loops.live_loop.OwnError"
    assert caught.value.message == "bad batch at step 1"


def _cli(*args: str, env: dict[str, str], timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainthrough.cli", "run", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_the_command_line_ends_a_crash_loop_in_one_line_with_exit_1(
        tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}", "TT_RAISE_AT": "1"}
    p = _cli("--paradigm", "dp", "--engine", "gloo", "--ranks", "2", "--workload",
             f"{LOOP}:train", "--strategy", "checkpoint-restart", "--max-restarts", "1",
             "--out", str(tmp_path / "run"), "--quiet", env=env)
    assert p.returncode == 1, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("trainthrough: run failed: rank 1: ValueError: bad batch at step 1 "
                           "(at step 1; 2 times in a row, never past step 1; max_restarts 1"), \
        p.stderr[-3000:]
    assert "Traceback" not in p.stderr.split("trainthrough: run failed")[-1]


def test_sigterm_to_the_whole_process_group_ends_the_run_as_interrupted(
        tmp_path: Path) -> None:
    """A SIGTERM to the whole process group (what ``timeout -s TERM`` sends, and a
    cluster preempting the job): the zygote dies at once and leaves its ranks to init,
    and these ranks ignore SIGTERM. The controller still ends them (each pinned when it
    started), and the command says it was terminated. The signal comes once both ranks
    have started, however long that takes on a loaded machine (a fixed 9 s came before
    them once in the full suite)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}", "TT_IGNORE_TERM": "1",
           "TT_PIDS": str(pids), "TT_EPOCHS": "100000", "TT_STEP_SLEEP": "0"}
    cmd = [sys.executable, "-m", "trainthrough.cli", "run", "--paradigm", "dp", "--engine",
           "gloo", "--ranks", "2", "--workload", f"{LOOP}:train", "--strategy", "rollback",
           "--out", str(tmp_path / "run"), "--quiet"]
    # A group of its own, as timeout makes one: the signal reaches the command's processes.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while len(list(pids.iterdir())) < 2 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        started = [int(f.name) for f in pids.iterdir()]
        assert len(started) >= 2 and proc.poll() is None, \
            f"the ranks never started: {proc.poll()} {started}"
        os.killpg(proc.pid, signal.SIGTERM)  # the group this test started, its leader alive
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    p = subprocess.CompletedProcess(cmd, proc.returncode, "", err)
    assert p.returncode == 143, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1].startswith("trainthrough: terminated;"), \
        p.stderr[-3000:]
    assert "SignalRefused" not in p.stderr and "Traceback" not in p.stderr
    deadline = time.time() + 10
    while any(identify(pid) for pid in started) and time.time() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in started if identify(pid)], "a rank outlived the run"
