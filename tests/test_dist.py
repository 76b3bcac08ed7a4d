"""The ``dist`` engine on real gloo processes (127.0.0.1): crash, hang, re-formation, join.

These start real rank processes (torch + gloo, spawn), so they take seconds each;
timeouts are short so a broken recovery fails fast instead of hanging the suite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import read_metrics, read_summary
from trainthrough.config import CostModel, RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.gloo.controller import GlooEngine
from trainthrough.lab.runner import build_engine, resolve_defaults, run_silent
from trainthrough.lab.validate import validate_run
from trainthrough.workloads import make_workload

pytestmark = pytest.mark.timeout(240)


class Watch(Callback):
    """Records events and evaluations; stops the run once ``done`` says so."""

    def __init__(self, done: Any = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.engine: GlooEngine | None = None
        self.done = done

    def on_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def after_eval(self, record: dict[str, Any]) -> None:
        self.evals.append(record)
        if self.done is not None and self.engine is not None and self.done(self):
            self.engine.request_stop()

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


def _engine(tmp_path: Path, cb: Watch, **kw: Any) -> GlooEngine:
    cfg, w = resolve_defaults(RunConfig(paradigm="dp", engine="dist", **kw))
    validate_run(cfg)
    e = build_engine(cfg, w, cb, str(tmp_path / "checkpoints"))
    assert isinstance(e, GlooEngine)
    cb.engine = e
    return e


def test_crash_in_allreduce_reform_rejoin_and_reach_the_target(tmp_path: Path) -> None:
    target = 0.3
    # Run until the target is reached *and* the replacement has joined (its process
    # needs a few seconds to start), then compare with sim step by step.
    cb = Watch(lambda w: bool(w.of("rank-joined")) and w.evals[-1]["metric"] <= target
               and w.evals[-1]["ranks"] == 4)
    e = _engine(tmp_path, cb, strategy="rollback", target=target, stop_at_target=False,
                max_iterations=4000, wall_limit=150, cost=CostModel(timeout_seconds=3),
                failures=["rank=1@iter=10,phase=allreduce:0"])
    r = e.run()
    x = r.extras
    assert r.converged and r.failures == 1
    assert x["detection_seconds"][0] < 1.0, x["detection_seconds"]
    assert x["reform_seconds"][0] < 2.0, x["reform_seconds"]
    rec = r.recoveries[0]
    assert rec.action == "mini-batch-rollback" and rec.perturbation_norm == 0.0
    assert rec.failed == ["rank1"] and rec.at_iteration == 10
    # The group grew back to N and every replica holds the same bits.
    assert x["ranks_min"] == 3 and x["ranks_final"] == 4 and x["ranks_joined"] == 1
    joined = cb.of("rank-joined")[0]
    assert joined["slots"] == [1] and x["replicas_identical"]
    # The state share is recorded: at least the parameters' bytes, within the join.
    x0 = make_workload(e.cfg.workload, seed=0).init_params(torch.Generator())  # shapes
    nbytes = sum(v.numel() * v.element_size() for v in x0.values())
    assert joined["bytes"] >= nbytes and 0 < joined["transfer_seconds"] < joined["join_seconds"]
    # Every slot's last process ended normally and said how large it grew.
    assert all(b > 100 * 2**20 for b in x["peak_rss_bytes"]), x["peak_rss_bytes"]
    assert all(p.exitcode is not None for p in e.procs.started)
    # Same math as sim: rollback keeps the global batch, so at every logical step the
    # model is the failure-free one (up to float summation order across processes).
    last = max(ev["logical_iteration"] for ev in cb.evals)
    sim = Watch()
    run_silent(RunConfig(paradigm="dp", strategy="rollback", max_iterations=last, eval_every=1,
                         stop_at_target=False), sim)
    ref = {ev["iteration"]: ev["metric"] for ev in sim.evals}
    for ev in cb.evals:
        assert ev["metric"] == pytest.approx(ref[ev["logical_iteration"]], rel=1e-4, abs=1e-5)


class Last(Watch):
    """Also keeps the last evaluation and its logical iteration. (The parameters stay
    in the ranks, which evaluate them in place: the scores are what the controller has.)"""

    def __init__(self, done: Any = None) -> None:
        super().__init__(done)
        self.last: dict[str, Any] = {}
        self.logical = -1

    def after_eval(self, record: dict[str, Any]) -> None:
        self.logical = int(record.get("logical_iteration", record["iteration"]))
        self.last = record
        super().after_eval(record)


def _same_model(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two evaluations of models equal up to float summation order: the test loss
    (a smooth function of every parameter) and the test accuracy agree."""
    assert a["metric"] == pytest.approx(b["metric"], rel=1e-6), (a, b)
    assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=1e-3), (a, b)


def test_rollback_matches_sim_within_1e6_after_rank_0_rejoins(tmp_path: Path) -> None:
    """The shared step on gloo: DP rollback equals the failure-free run (sim) from the
    failed step on, within float summation noise; the replacement of rank 0 receives
    the state from a live peer (it is the lowest slot, yet it must not send)."""
    cb = Last(lambda w: bool(w.of("rank-joined")) and w.evals[-1]["ranks"] == 4
              and w.logical >= 40)
    e = _engine(tmp_path, cb, strategy="rollback", stop_at_target=False, max_iterations=4000,
                wall_limit=150, cost=CostModel(timeout_seconds=3),
                failures=["rank=0@iter=8,phase=allreduce:0"])
    r = e.run()
    assert r.failures == 1 and r.recoveries[0].action == "mini-batch-rollback"
    assert cb.of("rank-joined")[0]["slots"] == [0] and r.extras["replicas_identical"]
    # The perturbation is measured by the same code as sim's (here: nothing moved).
    failed = run_silent(RunConfig(paradigm="dp", strategy="rollback", max_iterations=12,
                                  stop_at_target=False,
                                  failures=["rank=0@iter=8,phase=allreduce:0"]))
    sim_norm = failed.recoveries[0].perturbation_norm
    assert abs(r.recoveries[0].perturbation_norm - sim_norm) <= 1e-6, (r.recoveries, sim_norm)
    # Nothing was lost: the group never went back (a joiner sending x0 would rewind it).
    logical = [ev["logical_iteration"] for ev in cb.evals]
    assert logical == sorted(logical), logical
    sim = Last()
    run_silent(RunConfig(paradigm="dp", strategy="rollback", max_iterations=cb.logical,
                         stop_at_target=False), sim)
    assert sim.logical == cb.logical
    _same_model(cb.last, sim.last)


def test_lossy_forward_drops_the_same_share_as_sim(tmp_path: Path) -> None:
    """Lossy-forward completion is the shared routine on both hosts: the survivors
    finish the interrupted step without rank 2's share, and carry on as in sim."""
    kw: dict[str, Any] = dict(strategy="lossy-forward", replace=False, max_iterations=30,
                              stop_at_target=False, eval_every=10, allreduce_buckets=4,
                              failures=["rank=2@iter=12,phase=allreduce:1"])
    cb = Last()
    r = _engine(tmp_path, cb, cost=CostModel(timeout_seconds=3), **kw).run()
    sim = Last()
    s = run_silent(RunConfig(paradigm="dp", **kw), sim)
    assert r.failures == s.failures == 1 and r.extras["replicas_identical"]
    assert r.extras["samples_dropped"] == s.extras["samples_dropped"] == 32
    assert r.updates_lost == s.updates_lost == 1
    # The same perturbation: the completed step's distance from the failure-free one.
    norm, sim_norm = r.recoveries[0].perturbation_norm, s.recoveries[0].perturbation_norm
    assert sim_norm > 0.01 and abs(norm - sim_norm) <= 1e-6, (norm, sim_norm)
    assert cb.logical == sim.logical == 30
    _same_model(cb.last, sim.last)


def test_hung_rank_is_found_by_the_timeout_and_the_group_restarts(tmp_path: Path) -> None:
    cb = Watch()
    kw: dict[str, Any] = dict(strategy="checkpoint-restart", checkpoint_every=10, ranks=3,
                              max_iterations=40, stop_at_target=False,
                              failures=["rank=2@iter=15,phase=allreduce:0,mode=hang"])
    e = _engine(tmp_path, cb, cost=CostModel(timeout_seconds=2.0), **kw)
    r = e.run()
    x = r.extras
    assert r.failures == 1 and x["restarts"] == 1
    # Detected when the collective timed out, not before, and not much after.
    assert 1.9 <= x["detection_seconds"][0] < 3.0, x["detection_seconds"]
    rec = r.recoveries[0]
    assert rec.action == "rollback-all" and rec.restored_from == 10
    # The hung process was fenced, and ended with the run; the restarted group has all
    # its ranks again.
    assert all(p.exitcode is not None for p in e.procs.started)
    assert x["ranks_final"] == 3 and x["replicas_identical"]
    # Steps 11..15 were lost; the interrupted 16th attempt counts as executed (as in sim).
    assert rec.at_iteration == 15
    assert x["logical_iterations"] == 40 - 1 - 5 and r.updates_lost == 5 * 3
    assert r.checkpoints >= 3 and {"failure", "detection", "recovery"} <= {
        ev["type"] for ev in cb.events}
    # Counted once, by the controller's Checkpointer, from rank 0's reports: the saves
    # sim makes (10; after the restart from 10, 20 and 30).
    saves = cb.of("checkpoint")
    assert len(saves) == r.checkpoints and sum(c["bytes"] for c in saves) == r.checkpoint_bytes
    sim = Watch()
    s = run_silent(RunConfig(paradigm="dp", **kw), sim)
    assert [c["iteration"] for c in saves] == [c["iteration"] for c in sim.of("checkpoint")]
    # The restart moved the model as far as in sim: from step 15 back to checkpoint 10.
    sim_norm = s.recoveries[0].perturbation_norm
    assert sim_norm > 0.1 and abs(rec.perturbation_norm - sim_norm) <= 1e-6, (rec, sim_norm)


def test_bad_dist_input_exits_2(cli, tmp_path: Path) -> None:  # noqa: ANN001
    cases = [(["--engine", "dist"], "--paradigm dp"),
             (["--engine", "dist", "--paradigm", "dp", "--strategy", "rollback", "--fail",
               "rank=1@iter=5,phase=recovery"], "gloo engine"),  # dist is its alias
             (["--engine", "dist", "--paradigm", "dp", "--strategy", "rollback", "--fail",
               "rank=7@iter=5"], "rank 7"),
             (["--engine", "dist", "--paradigm", "dp", "--strategy", "scar"], "parameter-server"),
             (["--engine", "dist", "--paradigm", "dp", "--workload", "mf",
               "--strategy", "rollback"], "data-parallel")]
    for i, (args, words) in enumerate(cases):
        out = tmp_path / f"r{i}"
        r = cli("run", *args, "--quiet", "--out", str(out))
        assert r.code == 2, (args, r.err)
        assert words in r.err and len(r.err.strip().splitlines()) == 1, r.err
        assert not out.exists()


def test_async_checkpoint_restart_writes_in_the_background_and_restores(tmp_path: Path) -> None:
    """checkpoint-restart with persist=async on gloo: saves written by rank 0's
    background thread are counted, the restart loads the last one before the failure,
    and the run's summary records the device and the collective it used."""
    cb = Watch()
    e = _engine(tmp_path, cb, workload="mlr", ranks=3, max_iterations=45,
                strategy="base=checkpoint-restart,persist=async", checkpoint_every=10,
                failures=["rank=1@iter=25"], recovery_delay=0.1,
                cost=CostModel(timeout_seconds=2.0))
    r = e.run()
    assert r.failures == 1 and r.checkpoints >= 3, (r.failures, r.checkpoints)
    assert [x.restored_from for x in r.recoveries] == [20]
    assert r.extras["device"] == "cpu"
    assert r.extras["collective"]["backend"] == "gloo"
    assert r.extras["replicas_identical"] is True
    saved = sorted(int(p.name.split("-")[1]) for p in
                   (tmp_path / "checkpoints").rglob("ckpt-*") if p.is_dir())
    assert saved and max(saved) >= 30, saved  # written after the restart too


#: An MLP 784 -> 2048 -> 2048 -> 10, 5.8M parameters: three times the 8 MiB the store
#: takes in one value, which its parameters once had to fit in (examples/wide_mlp.py).
WIDE = str(Path(__file__).resolve().parents[1] / "examples" / "wide_mlp.py") + ":build"


def test_a_model_over_the_stores_cap_trains_and_is_evaluated_in_place(tmp_path: Path,
                                                                       cli) -> None:  # noqa: ANN001
    """By reference on the command line, as a user runs it: the first rank evaluates
    its replica in place and posts scores only, and when the first member is killed,
    its survivor measures the restart against the checkpoint (the parameters once went
    to the controller as one store value, which the store refused over 8 MiB)."""
    w = make_workload(WIDE, seed=0)
    params = w.init_params(torch.Generator().manual_seed(0))
    assert sum(v.numel() * v.element_size() for v in params.values()) > 2 * 8 * 2**20
    out = tmp_path / "run"
    r = cli("run", "--engine", "gloo", "--paradigm", "dp", "--ranks", "2", "--workload", WIDE,
            "--target", "0.6", "--checkpoint-every", "4", "--fail", "rank=0@iter=6",
            "--out", str(out), "--quiet")
    assert r.code == 0, r.err
    s = read_summary(out)
    assert s["converged"] and s["failures"] == 1, s
    rec = s["recoveries"][0]
    assert rec["action"] == "rollback-all" and rec["restored_from"] == 4
    assert 0 < rec["perturbation_norm"] < float("inf"), rec  # measured by the survivor
    scored = [r["iteration"] for r in read_metrics(out)]
    assert scored[0] == 0 and scored[-1] >= s["iterations_to_target"], scored
