"""Short form of ``benchmarks/vs_torchft.py``: its figures from logs (no processes), and
its smallest real run (30 steps, no kills, torchft and trainthrough once each)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import vs_torchft  # noqa: E402


def _logs() -> list[dict[str, float]]:
    """Two replicas: steps 1-15 by both (0.1 s apart), replica 1 killed at 1.55 s,
    replica 0 alone for steps 16-17, both again from step 18 to 20."""
    recs = []
    for s in range(1, 16):
        recs += [{"replica": r, "t": s * 0.1, "step": s, "n": 2} for r in (0, 1)]
    recs += [{"replica": 1, "t": 1.55, "kill": 15}, {"replica": 0, "t": 1.56, "failed": 15},
             {"replica": 0, "t": 2.55, "step": 16, "n": 1},
             {"replica": 0, "t": 2.65, "step": 17, "n": 1}]
    for s, t in ((18, 3.55), (19, 3.65), (20, 3.75)):
        recs += [{"replica": r, "t": t, "step": s, "n": 2} for r in (0, 1)]
    recs += [{"replica": 0, "t": 3.8, "final": 20, "accuracy": 0.9},
             {"replica": 1, "t": 3.8, "final": 20, "accuracy": 0.9},
             {"replica": 1, "t": 9.0, "kill": 20}]  # after the end: not counted
    return recs


def test_torchft_figures_from_logs() -> None:
    m = vs_torchft.torchft_measure(_logs(), steps=20, kills=[15])
    assert m.free_steps_per_s == pytest.approx(5 / 0.5)  # steps 10..15
    assert m.steps_per_s == pytest.approx(10 / 2.75)  # steps 10..20, the stall included
    assert m.stalls == [pytest.approx(1.0)]  # kill -> step 16
    assert m.rejoins == [pytest.approx(2.0)]  # kill -> step 18, both replicas again
    assert m.accuracy == pytest.approx(0.9)
    assert m.full == pytest.approx(18 / 20)  # steps 16 and 17 by one replica


def test_rejoin_only_before_the_next_kill() -> None:
    assert vs_torchft._rejoins([1.0, 2.0], [2.5, 3.5], end=4.0) == [None, pytest.approx(0.5)]


def test_trainthrough_kills_at_the_same_committed_steps() -> None:
    # rollback executes the interrupted step twice: @iter= counts executed attempts
    roll = vs_torchft.trainthrough_config("rollback", 300, [100, 200])
    assert roll.failures == ["rank=1@iter=100,phase=allreduce:0",
                             "rank=1@iter=201,phase=allreduce:0"]
    assert roll.max_iterations == 302
    lossy = vs_torchft.trainthrough_config("lossy-forward", 300, [100, 200])
    assert lossy.failures[1] == "rank=1@iter=200,phase=allreduce:0"
    assert lossy.max_iterations == 300


@pytest.mark.skipif(importlib.util.find_spec("torchft") is None,
                    reason="torchft is not installed (pip install -e '.[bench]')")
@pytest.mark.timeout(120)
def test_smallest_run(capsys: pytest.CaptureFixture[str]) -> None:
    vs_torchft.main(["--steps", "30", "--repeats", "1", "--no-kills", "--no-warmup"])
    out = capsys.readouterr().out
    table = out[out.index("\nsystem"):]
    for label in ("torchft (heartbeat 1 s)", "trainthrough gloo rollback",
                  "trainthrough gloo lossy-forward"):
        row = next(x for x in table.splitlines() if x.startswith(label))
        free, acc = row[len(label):].split("]")[:2]
        assert float(free.split()[0]) > 0, row
        assert 0.1 < float(acc.split()[0]) <= 1, row
    assert "not measured" not in table
    assert "gloo rollback / torchft (heartbeat 1 s): free steps/s" in out
