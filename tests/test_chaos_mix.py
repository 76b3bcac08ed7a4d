"""The chaos soak's fault mix without processes: the plan it lays out and the table it
draws from a run's events (``benchmarks/chaos_mix.py``)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from chaos_mix import GLOO_KINDS, Fault, Kind, Sent, plan, table, tally, wipes  # noqa: E402


def test_the_plan_gives_every_kind_its_share_one_fault_per_slice() -> None:
    faults = plan(110, 1.5, 286.5, GLOO_KINDS, seed=3)
    assert len(faults) == 110
    counts = Counter(f.kind.name for f in faults)
    total = sum(k.weight for k in GLOO_KINDS)
    for k in GLOO_KINDS:  # largest remainder: each within one of its exact share
        assert abs(counts[k.name] - 110 * k.weight / total) < 1
    times = [f.at for f in faults]
    assert times == sorted(times) and times[0] >= 1.5 and times[-1] < 288
    # One per slice of the window, never two in the same one.
    assert all(int((t - 1.5) // (286.5 / 110)) == i for i, t in enumerate(times))
    assert plan(110, 1.5, 286.5, GLOO_KINDS, seed=3) == faults
    assert plan(110, 1.5, 286.5, GLOO_KINDS, seed=4) != faults


def _kind(name: str) -> Kind:
    return next(k for k in GLOO_KINDS if k.name == name)


def _failure(f: Fault, slot: int) -> dict[str, Any]:
    return {"type": "failure", "ids": [slot], "spec": f.spec()}


def test_the_tally_says_what_answered_each_fault() -> None:
    pause = Fault(2.0, _kind("pause-4s"))
    short = Fault(4.0, _kind("pause-300ms"))
    pre = Fault(6.0, _kind("preempt-5s"))
    slow = Fault(8.0, _kind("slow-4x"))
    hang = Fault(10.0, _kind("hang"))
    out = Fault(12.0, _kind("sigterm-5s"))
    faults = [pause, short, pre, slow, hang, out, Fault(14.0, _kind("sigterm-5s")),
              Fault(15.0, _kind("sigterm-5s"))]
    sent = [Sent(101, 12.0, None, "left"), Sent(102, 14.0, None, "killed"),
            Sent(7, 15.0, None, "left")]  # the hung process: fenced out already
    events = [
        _failure(pause, 1), {"type": "rank-fenced", "slot": 1, "inc": 0},
        {"type": "detection", "failed": ["rank1"]},
        {"type": "pause-ended", "slot": 1, "member": False},  # woke after the fence
        _failure(short, 2), {"type": "pause-ended", "slot": 2, "member": True},
        _failure(pre, 0), {"type": "drained", "slots": [0]},
        _failure(slow, 2),
        {**_failure(hang, 0), "mode": "hang", "pid": 7}, {"type": "rank-fenced", "slot": 0},
        {"type": "detection", "failed": ["rank0"]},
        _failure(hang, 1),  # struck nothing that answered: the run must flag it
        {"type": "preempt-notice", "slot": 0, "pid": 101, "source": "signal"},
        {"type": "drained", "slots": [0]},
    ]
    rows = tally(events, faults, sent)
    assert rows["pause-4s"] == {"injected": 1, "drained": 0, "fenced": 1, "recovered": 1,
                                "went on": 0, "killed at notice end": 0, "unanswered": 0}
    assert rows["pause-300ms"]["went on"] == 1
    assert rows["preempt-5s"]["drained"] == 1
    assert rows["slow-4x"]["went on"] == 1  # the group ran at its pace
    assert rows["hang"] == {"injected": 2, "drained": 0, "fenced": 1, "recovered": 1,
                            "went on": 0, "killed at notice end": 0, "unanswered": 1}
    # One SIGTERM taken as a notice and drained; one never noticed, killed at its end;
    # one to a process fenced out already.
    assert rows["sigterm-5s"] == {"injected": 3, "drained": 1, "fenced": 1, "recovered": 0,
                                  "went on": 0, "killed at notice end": 1, "unanswered": 0}
    lines = table(rows).splitlines()
    assert lines[0].startswith("| kind | injected | drained |")
    assert lines[-1] == "| total | 9 | 2 | 3 | 2 | 2 | 1 | 1 |"


def test_a_wipe_is_every_rank_lost_at_once_and_its_loss_counted_in_updates() -> None:
    events: list[dict[str, Any]] = [
        {"type": "failure", "logical": 40}, {"type": "detection", "survivors": [0, 2]},
        {"type": "failure", "logical": 50}, {"type": "detection", "survivors": [2]},
        {"type": "failure", "logical": 57}, {"type": "detection", "survivors": []},
        {"type": "failure", "logical": 0},  # a stale order striking the restarted group
        {"type": "restored", "step": 0},
        {"type": "failure", "logical": 9}, {"type": "detection", "survivors": [1]},
        {"type": "restored", "step": 5},  # a restart with a survivor: not a wipe
    ]
    assert wipes(events, ranks=3) == (1, 57 * 3)
