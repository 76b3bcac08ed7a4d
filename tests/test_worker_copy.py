"""Worker-copy recovery: lost shard rows from the parameters live workers last pulled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainthrough.config import RunConfig
from trainthrough.engines.result import RunResult
from trainthrough.errors import UserError
from trainthrough.ft.decisions import RecoveryAction
from trainthrough.ft.recovery import FromWorkerCopies
from trainthrough.ft.strategy import PRESETS, resolve
from trainthrough.ft.worker_copy import rebuild, replay
from trainthrough.lab.runner import run_silent
from trainthrough.lab.suites import core
from trainthrough.ps.layout import RowBlock
from trainthrough.ps.shard import Shard
from trainthrough.ps.worker import WorkerCopy
from trainthrough.workloads.base import OptimizerSpec
from trainthrough.workloads.ridge import Ridge


def test_policy_takes_the_checkpoint_for_what_workers_lack_when_there_is_one() -> None:
    d = FromWorkerCopies().decide((1, 3), have_checkpoint=True)
    assert d.action is RecoveryAction.WORKER_COPY and d.shards == (1, 3)
    assert d.from_checkpoint and not d.rewind
    assert not FromWorkerCopies().decide((0,), have_checkpoint=False).from_checkpoint


def test_preset_and_composition_are_parameter_server_only() -> None:
    p = PRESETS["worker-copy"]
    assert (p.checkpoint, p.recovery) == ("full", "worker-copy")
    c = resolve("checkpoint=full,recovery=worker-copy")
    assert c.paradigms == ("ps",) and isinstance(c.recovery_policy(), FromWorkerCopies)
    with pytest.raises(UserError, match="parameter-server"):
        p.require("dp")


def _copy(worker: int, version: int, fill: float, held: list[bool] | None = None
          ) -> WorkerCopy:
    mask = None if held is None else {"w": torch.tensor(held)}
    return WorkerCopy(worker, (0, version), {"w": torch.full((6, 2), fill)}, mask)


def test_rebuild_takes_each_row_from_the_freshest_copy_that_holds_it() -> None:
    block = (RowBlock("w", 2, 6),)  # shard 1 owns rows 2..5
    stale = _copy(0, 7, 1.0)
    fresh = _copy(1, 9, 2.0, held=[True, True, True, False, True, False])
    r = rebuild(1, block, [stale, fresh])
    assert r.values["w"][:, 0].tolist() == [2.0, 1.0, 2.0, 1.0]
    assert r.sources == {1: 2, 0: 2} and r.version == 9 and r.rows_from_workers == 4
    # Rows no live copy holds stay uncovered (the checkpoint's, or initial values).
    r = rebuild(1, block, [fresh])
    assert r.covered["w"].tolist() == [True, False, True, False]
    assert rebuild(1, block, []).version is None


def test_replay_needs_every_push_of_the_round() -> None:
    shard = Shard(0, (RowBlock("w", 0, 2),), OptimizerSpec(kind="sgd", lr=0.5),
                  {"w": torch.zeros(2, 1)})
    shard.version = 4
    push = [{"w": torch.ones(2, 1)}]
    copies = [WorkerCopy(i, (4,), {"w": torch.zeros(2, 1)}, pushed=push) for i in range(2)]
    r = rebuild(0, shard.blocks, copies)
    assert not replay(shard, r, copies[:1], 5, round_size=2, divide_by=1)
    assert not replay(shard, r, copies, 6, round_size=2, divide_by=1)  # two rounds behind
    assert replay(shard, r, copies, 5, round_size=2, divide_by=1)
    assert shard.values["w"].flatten().tolist() == [-1.0, -1.0] and shard.version == 5


def _ridge(fails: list[str], **kw: object) -> RunResult:
    cfg = RunConfig(workload="ridge", strategy=kw.pop("strategy", "worker-copy"),
                    failures=fails, seed=0, eval_every=1, checkpoint_every=20,
                    max_iterations=60, stop_at_target=False, **kw)  # type: ignore[arg-type]
    return run_silent(cfg)


def _ridge_iterates(steps: int) -> list[torch.Tensor]:
    """Full-batch gradient descent on the same ridge problem, outside any engine."""
    w = Ridge()
    x = w.init_params(torch.Generator())["w"]
    out = [x]
    for _ in range(steps):
        grad = w.x.T @ (w.x @ x - w.y) / w.n + w.lam * x
        x = x - w.default_optimizer.lr * grad
        out.append(x)
    return out


def test_perturbation_is_exactly_one_steps_update_on_the_lost_rows() -> None:
    """Bulk-synchronous, shard 1 lost at iteration 30 with worker 0: the live workers
    pulled x_29, and the round's pushes are incomplete (worker 0's is gone), so the lost
    rows come back as x_29's: the perturbation is the one-step update x_30 - x_29 there,
    and zero elsewhere."""
    s = _ridge(["shards=1@iter=30", "worker=0@iter=30"])
    rec = s.recoveries[0]
    xs = _ridge_iterates(30)
    lost = slice(16, 32)  # 64 rows over 4 shards: shard 1 holds rows 16..31
    step = float((xs[30][lost] - xs[29][lost]).norm())
    assert step > 1e-4  # a step that can be told apart from zero
    assert rec.perturbation_norm_lost == pytest.approx(step, rel=1e-9)
    assert rec.perturbation_norm == pytest.approx(rec.perturbation_norm_lost, rel=1e-12)
    wc = rec.worker_copy
    assert wc["rows_from_workers"] == 16 and wc["rows_from_checkpoint"] == 0
    assert wc["copy_lag"] == 1 and wc["rounds_replayed"] == 0
    # Each of the 4 workers asked for its version, the freshest lowest id for its rows
    # (16 float64 rows); no push asked for: the round is not whole.
    assert wc["messages"] == 2 * 4 + 2 and wc["bytes"] == 16 * 8


def test_with_every_pusher_alive_the_round_is_replayed_and_nothing_is_lost() -> None:
    s = _ridge(["shards=1,2@iter=30"])
    rec = s.recoveries[0]
    assert rec.perturbation_norm == 0.0 and rec.worker_copy["rounds_replayed"] == 2
    # Per shard: 4 version queries, one worker's rows, 4 push slices.
    assert rec.worker_copy["messages"] == 2 * (2 * 4 + 2 + 2 * 4)


def test_rows_no_live_worker_holds_come_from_the_checkpoint_or_initial_values() -> None:
    every_worker = [f"worker={i}@iter=30" for i in range(4)]
    rec = _ridge(["shards=1@iter=30", *every_worker]).recoveries[0].worker_copy
    assert rec["rows_from_workers"] == 0 and rec["rows_from_checkpoint"] == 16
    bare = _ridge(["shards=1@iter=30", *every_worker], strategy="recovery=worker-copy")
    rec = bare.recoveries[0].worker_copy  # no checkpoints kept at all
    assert rec["rows_initial"] == 16 and rec["copy_lag"] is None


def test_bounded_staleness_uses_the_freshest_copy() -> None:
    s = _ridge(["shards=1@iter=30"], consistency="ssp", staleness=2)
    wc = s.recoveries[0].worker_copy
    assert wc["rows_from_workers"] == 16 and wc["rounds_replayed"] == 0
    assert wc["copy_lag"] is not None and 1 <= wc["copy_lag"] <= 4 * (2 + 1)


def test_data_parallel_and_other_engines_refuse_it_with_one_line(cli, tmp_path: Path  # noqa: ANN001
                                                                 ) -> None:
    r = cli("run", "--quiet", "--paradigm", "dp", "--strategy", "worker-copy",
            "--out", str(tmp_path / "a"))
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
    r = cli("run", "--quiet", "--engine", "gloo", "--strategy", "recovery=worker-copy",
            "--out", str(tmp_path / "b"))
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_core_suite_puts_worker_copy_next_to_the_others() -> None:
    spec = core.build(quick=True)
    assert "worker-copy" in {r.config.strategy for r in spec.runs}


def test_a_worker_lost_with_a_shard_restarts_from_the_recovered_parameters() -> None:
    """lda builds a worker's state from the parameters: a replacement that read a lost
    shard's wiped rows failed with NaN probabilities before restarts waited for recovery."""
    s = run_silent(RunConfig(workload="lda", strategy="scar", seed=0, max_iterations=8,
                             checkpoint_every=5, stop_at_target=False,
                             failures=["shards=1@iter=7", "worker=0@iter=7"]))
    assert s.failures == 2 and s.recoveries[0].perturbation_norm > 0
