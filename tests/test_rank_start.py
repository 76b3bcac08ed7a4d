"""Local ranks forked from the warm zygote behave as ranks started with ``python -m``.

The zygote imported torch before the test changed anything: a forked rank must still
see the caller's environment as it is when the rank starts, write where the caller
writes, and train exactly as a cold-started rank does.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.loops.ledger_loop import train as ledger_train
from trainthrough.config import RunConfig
from trainthrough.engines.gloo import zygote
from trainthrough.engines.gloo.procs import LocalProcess, local_launch
from trainthrough.errors import UserError
from trainthrough.lab.runner import run_silent
from trainthrough.loop import launch


def test_gloo_ranks_forked_warm_see_the_environment_set_after_the_zygote_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINTHROUGH_RANK_START", "fork")
    warm = zygote.shared()
    warm.wait_ready()
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    monkeypatch.setenv("TT_LEDGER", str(ledger))  # read by each rank of the loop
    r = launch(ledger_train, ranks=2, engine="gloo", strategy="rollback",
               fail=["rank=1@iter=5"], out=str(tmp_path / "run"), recovery_delay=0.2,
               timeout=5.0, progress=False)
    assert zygote.shared() is warm  # one zygote served the run
    pids = {int(f.stem) for f in ledger.iterdir()}  # each rank writes its own file
    assert len(pids) >= 2 and not pids & {os.getpid(), warm.proc.pid}, pids
    assert r.summary.result.failures == 1 and r.summary.result.extras["replicas_identical"]
    # The optimizer's first import (~1 s of CPU a rank) was paid once, by the zygote.
    assert r.returned["warm"] is True, r.returned


def test_gloo_ranks_forked_and_started_cold_train_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = RunConfig(workload="mlr", paradigm="dp", engine="gloo", ranks=2, strategy="rollback",
                    max_iterations=30, eval_every=10, stop_at_target=False,
                    failures=["rank=1@iter=12"])
    out = {}
    for how in ("exec", "fork"):
        monkeypatch.setenv("TRAINTHROUGH_RANK_START", how)
        out[how] = run_silent(cfg)
    assert out["fork"].final_metric == out["exec"].final_metric
    assert out["fork"].failures == out["exec"].failures == 1


def test_how_ranks_start_is_fork_exec_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINTHROUGH_RANK_START", "exec")
    assert local_launch() is LocalProcess
    monkeypatch.setenv("TRAINTHROUGH_RANK_START", "spawn")
    with pytest.raises(UserError, match="TRAINTHROUGH_RANK_START must be one of: fork, exec"):
        local_launch()
