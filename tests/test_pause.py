"""Paused and slow ranks on real gloo processes (issue 32): a rank paused longer than
its peers wait is fenced out of the group, wakes, has its writes refused and leaves,
without a sample committed twice; a pause shorter than that goes unnoticed; a slow
rank is dropped by the straggler deadline and replaced. Each run a few seconds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.loops.ledger_loop import train as ledger_train
from tests.loops.live_loop import train
from tests.test_loop import _check_exactly_once
from trainthrough.loop import launch

pytestmark = pytest.mark.timeout(180)


def _events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]


def test_a_rank_paused_past_the_collective_timeout_is_fenced_and_its_late_writes_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's run: rank 1 of 3 stops for 5 s at step 2; its peers' collective times
    out after 2 s, the controller fences it (not killed: a pause ends), the group goes
    on without it and a replacement joins. When the pause ends the woken rank finds
    itself out: what it writes (that it is awake, its last words) is refused, it
    commits nothing, and it leaves. Every sample is committed exactly once.

    Each micro-batch sleeps 0.15 s, so the 2 s timeout and the 30 steps left outlast the
    pause however fast the machine (at least 6.5 s): the rank wakes while the run goes
    on."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    monkeypatch.setenv("TT_LEDGER", str(ledger))
    monkeypatch.setenv("TT_STEP_SLEEP", "0.15")
    r = launch(ledger_train, ranks=3, engine="gloo", strategy="rollback",
               out=tmp_path / "run", progress=False, timeout=2.0, recovery_delay=0.5,
               fail="rank=1@iter=2,mode=pause:5s")
    hit = {"committed": r.committed}
    x = r.summary.result.extras
    ev = _events(tmp_path / "run")
    kinds = [e["type"] for e in ev]
    fail = next(e for e in ev if e["type"] == "failure")
    fenced = [e for e in ev if e["type"] == "rank-fenced"]
    woke = [e for e in ev if e["type"] == "pause-ended"]
    refused = [e for e in ev if e["type"] == "write-refused"]
    assert fail["mode"] == "pause" and r.summary.result.failures == 1
    assert [(e["slot"], e["inc"], e["reason"]) for e in fenced] == [(1, 0, "no-report")]
    # It woke (continued by the controller), no longer a member, after the fence.
    assert len(woke) == 1 and not woke[0]["member"] and woke[0]["paused_seconds"] >= 5.0
    assert kinds.index("rank-fenced") < kinds.index("pause-ended")
    # Everything it wrote after the fence was refused: at least that it woke and its
    # last words (its replica's hash must not stand for its slot's replacement).
    assert {e["message"] for e in refused} >= {"awake", "exit"}, refused
    assert all((e["slot"], e["inc"]) == (1, 0) for e in refused)
    assert x["writes_refused"] == len(refused)
    assert x["ranks_joined"] == 1 and x["ranks_final"] == 3 and x["replicas_identical"]
    _check_exactly_once(hit, ledger)
    # The woken process computed again after its pause (its file says so), but no step
    # it took part in after the pause was committed with it.
    committed = {(logical, attempt) for logical, attempt, members in r.committed
                 if 1 in members}
    mine = (ledger / f"{fail['pid']}.txt").read_text().splitlines()
    late = [tuple(int(x) for x in line.split()[:2]) for line in mine
            if int(line.split()[0]) >= fail["logical"]]
    assert late, "the paused rank never ran again"
    assert not set(late) & committed, late


def test_a_pause_shorter_than_the_collective_timeout_goes_unnoticed(tmp_path: Path) -> None:
    """Rank 1 stops for 0.5 s, its peer waits up to 5 s in the collective: the pause
    ends, the rank goes on as a member, and nothing is recovered or refused."""
    r = launch(train, ranks=2, engine="gloo", strategy="rollback", out=tmp_path / "run",
               progress=False, timeout=5.0, fail="rank=1@iter=3,mode=pause:500ms")
    ev = _events(tmp_path / "run")
    woke = [e for e in ev if e["type"] == "pause-ended"]
    assert len(woke) == 1 and woke[0]["member"]
    assert not [e for e in ev if e["type"] in ("detection", "rank-fenced", "write-refused")]
    assert r.summary.result.failures == 1 and not r.recoveries
    assert r.returned["steps"] == 8 and r.summary.result.extras["replicas_identical"]


def test_a_slow_rank_is_dropped_by_the_straggler_deadline_and_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 becomes 8 times slower at step 2 (each step's compute 0.2 s, so it keeps
    its peer waiting 1.4 s); with a deadline of 0.8 s its peer commits the step without
    it and a replacement, at full speed, joins."""
    monkeypatch.setenv("TT_COMPUTE", "0.2")
    monkeypatch.setenv("TT_EPOCHS", "2")  # 16 steps: the replacement joins before the end
    r = launch(train, ranks=2, engine="gloo", strategy="rollback", out=tmp_path / "run",
               progress=False, timeout=5.0, recovery_delay=0.2, straggler_deadline=0.8,
               fail="rank=1@iter=2,mode=slow:8x")
    ev = _events(tmp_path / "run")
    fenced = [e for e in ev if e["type"] == "rank-fenced"]
    assert [(e["slot"], e["reason"]) for e in fenced] == [(1, "straggler")]
    det = next(e for e in ev if e["type"] == "detection")
    assert det["failed"] == ["rank1"] and det["survivors"] == [0]
    assert r.summary.result.extras["ranks_joined"] == 1
    assert r.returned["steps"] == 16 and r.summary.result.extras["replicas_identical"]
