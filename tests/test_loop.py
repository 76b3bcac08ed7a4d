"""A user's own loop (trainthrough.loop): exactly-once samples through failures, the
example, the replica of a user's module, and a two-node Ray cluster losing a node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.loops.ledger_loop import SAMPLES
from tests.loops.ledger_loop import train as ledger_train
from trainthrough.dp.batching import MicroBatch
from trainthrough.dp.module_replica import ModuleReplica, StepFns
from trainthrough.errors import UserError
from trainthrough.loop.launch import reference_of

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "tests" / "loops" / "ledger_loop.py"
GLOBAL_BATCH = 3 * 16  # ledger_loop: 3 ranks of 16


def _ledger_run(tmp: Path, engine: str, strategy: str, fail: str,
                address: str | None = None, timeout: float = 240,
                env: dict[str, str] | None = None) -> tuple[dict[str, Any], Path]:
    ledger = tmp / "ledger"
    ledger.mkdir(parents=True)
    env = {**os.environ, **(env or {}), "TT_LEDGER": str(ledger),
           "PYTHONPATH": str(ROOT / "src")}
    args = [sys.executable, str(LEDGER), engine, strategy, fail, str(tmp / "run")]
    out = subprocess.run(args + ([address] if address else []), capture_output=True, text=True,
                         timeout=timeout, env=env, cwd=tmp)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), ledger


def _consumed(ledger: Path) -> dict[tuple[int, int, int], list[int]]:
    """(step, attempt, rank) -> the sample indices its loss function saw."""
    seen: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for f in ledger.iterdir():
        for line in f.read_text().splitlines():
            step, attempt, rank, *idx = (int(x) for x in line.split())
            seen[(step, attempt, rank)] += idx
    return seen


def _check_exactly_once(result: dict[str, Any], ledger: Path, epochs: int = 2) -> None:
    """Every sample of every epoch was consumed exactly once by the ranks that
    committed it (a restart's redone steps count in the attempt that committed last)."""
    final: dict[int, tuple[int, list[int]]] = {}
    for logical, attempt, members in result["committed"]:
        if logical not in final or attempt > final[logical][0]:
            final[logical] = (attempt, members)
    steps_per_epoch = SAMPLES // GLOBAL_BATCH
    assert sorted(final) == list(range(epochs * steps_per_epoch))
    seen = _consumed(ledger)
    for epoch in range(epochs):
        samples: list[int] = []
        for logical in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch):
            attempt, members = final[logical]
            step = [seen.get((logical, attempt, r), []) for r in members]
            assert all(step), f"a committing rank consumed nothing at step {logical}"
            assert sum(map(len, step)) == GLOBAL_BATCH, (logical, attempt, members)
            samples += [i for part in step for i in part]
        assert sorted(samples) == list(range(SAMPLES)), f"epoch {epoch}: not exactly once"


def test_rollback_consumes_every_sample_once_and_matches_the_failure_free_loop(
        tmp_path: Path) -> None:
    clean, _ = _ledger_run(tmp_path / "a", "gloo", "rollback", "-")
    hit, ledger = _ledger_run(tmp_path / "b", "gloo", "rollback", "rank=1@iter=12,phase=backward")
    s = hit["summary"]
    assert s["failures"] == 1 and s["recoveries"][0]["action"] == "mini-batch-rollback"
    assert s["replicas_identical"]
    _check_exactly_once(hit, ledger)
    # Rollback redoes the global batch: the same model up to float summation order.
    a, b = clean["returned"]["sum"], hit["returned"]["sum"]
    assert abs(a - b) <= 1e-3 * max(1.0, abs(a)), (a, b)


EXACT = ROOT / "tests" / "loops" / "exact_loop.py"


def _exact(tmp: Path, fail: str, micro: int, buckets: int, **options: Any) -> dict[str, Any]:
    tmp.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    args = [sys.executable, str(EXACT), str(tmp / "run"), fail, str(micro), str(buckets),
            json.dumps(options)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=200, env=env, cwd=tmp)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_launch_hands_the_loop_its_arguments_and_buckets_and_rollback_on_two_ranks_is_exact(
        tmp_path: Path) -> None:
    """``launch(options=..., allreduce_buckets=3)`` from Python, as the README's
    ``phase=allreduce:2`` failure needs; and what docs/own-loop.md says is exact: two
    ranks that each sum one micro-batch add the same two gradients in the same order
    (a + b) whether the step runs on both or is redone by the survivor alone."""
    clean = _exact(tmp_path / "a", "-", 1, 3, hidden=12, tag="x")
    hit = _exact(tmp_path / "b", "rank=1@iter=5,phase=allreduce:2", 1, 3, hidden=12, tag="x")
    assert clean["returned"]["hidden"] == hit["returned"]["hidden"] == 12
    assert clean["returned"]["tag"] == "x"
    s = hit["summary"]
    assert s["failures"] == 1 and s["recoveries"][0]["action"] == "mini-batch-rollback"
    events = [json.loads(x) for x in (tmp_path / "b" / "run" / "events.jsonl").read_text()
              .splitlines()]
    assert [e["phase"] for e in events if e["type"] == "failure"] == ["allreduce:2"]
    assert hit["returned"]["steps"] == clean["returned"]["steps"] == 16
    assert hit["returned"]["sha256"] == clean["returned"]["sha256"]  # every bit


def test_checkpoint_restart_replays_from_the_checkpoint_cursor(tmp_path: Path) -> None:
    hit, ledger = _ledger_run(tmp_path, "gloo", "checkpoint-restart", "rank=2@iter=25")
    s = hit["summary"]
    assert s["failures"] == 1 and s["recoveries"][0]["action"] == "rollback-all"
    assert s["recoveries"][0]["restored_from"] == 20  # checkpoint_every=10
    _check_exactly_once(hit, ledger)


def test_module_replica_state_round_trips_and_buffers_average() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    data = torch.randn(8, 3)
    r = ModuleReplica(0, model, opt, lambda rows: data[rows], run_seed=1)
    r.begin_step(StepFns(lambda x: model(x).pow(2).mean()))
    before = r.state()
    grads = r.new_grads(separate=True)
    r.gradients(0, [MicroBatch(0, torch.arange(4)), MicroBatch(1, torch.arange(4, 8))], grads)
    assert all(torch.equal(before[k], v) for k, v in r.state().items()), "gradients moved it"
    flat = (grads.parts[0][1] + grads.parts[1][1]) / 2
    # Summed in place into the replica's own vector: the same sum (its .grad are views).
    summed = r.new_grads(separate=False)
    r.gradients(0, [MicroBatch(0, torch.arange(4)), MicroBatch(1, torch.arange(4, 8))], summed)
    assert summed.flat is not None and torch.equal(summed.flat / 2, flat)
    r.apply(flat)
    mean_of_stats = model[1].running_mean.clone()
    # The buffers come first in the flat vector (BatchNorm: weight, bias, mean, var).
    assert torch.allclose(mean_of_stats, flat[:4])  # the buffers' mean, as reduced
    # A fresh replica of the same model takes the state, Adam moments included.
    model2 = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    r2 = ModuleReplica(1, model2, torch.optim.Adam(model2.parameters(), lr=0.1),
                       lambda rows: data[rows], run_seed=1)
    r2.load(r.state())
    s1, s2 = r.state(), r2.state()
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)


def test_a_file_travels_to_a_joined_cluster_by_working_dir() -> None:
    from trainthrough.engines.ray.runtime import shipped

    assert shipped("/u/proj/train.py:main", None) == (None, "/u/proj/train.py:main")
    assert shipped("pkg.mod:main", "127.0.0.2:6379") == (None, "pkg.mod:main")
    env, ref = shipped("/u/proj/train.py:main", "127.0.0.2:6379")
    assert ref == "train.py:main" and env is not None and env["working_dir"] == "/u/proj"
    assert "runs/" in env["excludes"] and ".venv/" in env["excludes"]


def test_a_rank_finds_the_loop_program_by_the_name_its_marker_carries() -> None:
    """The gloo engine imports no trainthrough.loop: a rank starts the program the marker
    names (``RANK_ENTRY``), so that name must keep pointing at ``run_loop``."""
    from trainthrough.engines.gloo.rank_main import loop_program
    from trainthrough.loop.rank import run_loop

    assert ledger_train.rank_entry == "trainthrough.loop.rank:run_loop"
    assert loop_program("tests.loops.ledger_loop:train") is run_loop
    with pytest.raises(UserError, match="not marked with @training_loop"):
        loop_program("tests.loops.ledger_loop:launch")


def test_a_loop_that_cannot_travel_is_refused() -> None:
    with pytest.raises(UserError, match="training_loop"):
        reference_of(lambda loop: None)  # type: ignore[arg-type]
    assert reference_of(ledger_train) == "tests.loops.ledger_loop:train"


def test_one_failure_spec_may_be_a_plain_string(tmp_path: Path) -> None:
    """Before, a string was split into its characters: "failure spec 'r'"."""
    from trainthrough.loop import launch

    with pytest.raises(UserError, match=r"'rank=9@iter=3': rank 9 does not exist"):
        launch(ledger_train, engine="gloo", fail="rank=9@iter=3", out=tmp_path / "o",
               progress=False)
    assert not (tmp_path / "o").exists()


def _netns_ok() -> bool:
    try:
        return subprocess.run(["unshare", "--net", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.timeout(600)
@pytest.mark.skipif(not _netns_ok(), reason="needs a network namespace (unshare --net, root): "
                    "a multi-node Ray listens on every interface")
def test_two_local_nodes_ranks_on_both_and_a_whole_node_lost(tmp_path: Path) -> None:
    script = ROOT / "tests" / "loops" / "two_nodes.py"
    inner = f"ip link set lo up && exec {sys.executable} {script} {tmp_path}"
    out = subprocess.run(["unshare", "--net", "sh", "-c", inner], capture_output=True,
                         text=True, timeout=560, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    s = result["summary"]
    nodes = {n for ns in s["rank_nodes"].values() for n in ns if n}
    assert len(nodes) == 2, s["rank_nodes"]  # ranks were placed on both nodes
    assert result["node_killed_after_step"] < 60, "the node was lost too late to matter"
    # On a cluster it joins, the ranks import the copy of the file Ray shipped them.
    assert Path(result["returned"]["file"]).resolve() != (ROOT / "tests" / "loops" /
                                                          "ledger_loop.py").resolve()
    assert s["recoveries"], "the lost node's ranks were never recovered"
    _check_exactly_once(result, tmp_path / "ledger")


def test_a_job_that_died_whole_resumes_with_every_registered_state(tmp_path: Path) -> None:
    """launch(resume=True): the run continues from its last checkpoint with the model,
    the optimizer, the data position, a per-epoch StepLR and a user's counter, and ends
    where the run that never died ends."""
    loop = ROOT / "tests" / "loops" / "resume_loop.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def go(out: str, *extra: str, die: str = "-1") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(loop), str(tmp_path / out), *extra],
                              capture_output=True, text=True, timeout=240, cwd=tmp_path,
                              env={**env, "TT_DIE_AT": die})

    clean = go("clean")
    assert clean.returncode == 0, clean.stderr[-3000:]
    died = go("died", die="25")
    assert died.returncode != 0 and "planned death after step 25" in died.stderr
    assert json.loads((tmp_path / "died" / "status.json").read_text())["state"] == "failed"
    # A resume that would train differently is refused in one line, before any process.
    from tests.loops.resume_loop import train as resume_train
    from trainthrough.loop import launch

    with pytest.raises(UserError, match=r"^launch\(resume=True\): the run in .* trained with "
                                        r"seed = 0, not 1; resume it with the same arguments"):
        launch(resume_train, ranks=2, engine="gloo", strategy="checkpoint-restart", seed=1,
               out=tmp_path / "died", progress=False, resume=True)
    resumed = go("died", "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = json.loads(clean.stdout.strip().splitlines()[-1])
    b = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert b["resumed_from"] == 20 and b["identical"]  # checkpoint_every=10
    assert b["returned"]["updates"] == a["returned"]["updates"] == 36
    assert b["returned"]["lr"] == a["returned"]["lr"] == 0.1 * 0.5**3
    assert abs(a["returned"]["sum"] - b["returned"]["sum"]) <= 1e-6 * max(1.0, abs(a["returned"]["sum"]))


@pytest.mark.timeout(120)
def test_your_loop_trains_with_diloco_through_a_lost_rank(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Your optimizer is DiLoCo's inner one; a rank lost among inner steps is dropped
    from the next outer step and nobody redoes a step."""
    from trainthrough.loop import launch

    monkeypatch.setenv("TT_LEDGER", str(tmp_path))
    r = launch(ledger_train, engine="gloo", ranks=3, strategy="diloco", sync_every=4,
               fail="rank=2@iter=9,phase=inner", replace=False, out=tmp_path / "o",
               progress=False)
    s = r.summary.result
    assert s.failures == 1 and s.extras["replicas_identical"]
    assert [x.action for x in r.recoveries] == ["drop-local"]
    seen: dict[int, dict[int, set[int]]] = {}  # rank -> step -> attempts
    for f in tmp_path.glob("*.txt"):
        for line in f.read_text().splitlines():
            step, attempt, rank = (int(x) for x in line.split()[:3])
            seen.setdefault(rank, {}).setdefault(step, set()).add(attempt)
    # Nobody redid a step (one attempt each); rank 2 computed its 10th step and was
    # gone, the survivors went on with every step.
    assert all(len(a) == 1 for steps in seen.values() for a in steps.values())
    assert max(seen[2]) == 9 and set(seen[0]) == set(seen[1]) == set(range(max(seen[0]) + 1))
    assert max(seen[0]) > 9


BUCKETS = ROOT / "tests" / "loops" / "buckets_loop.py"


def _buckets_run(buckets: int | None, strategy: str = "rollback",
                 fail: tuple[str, ...] = ()) -> dict[str, Any]:
    from trainthrough.config import CostModel, RunConfig
    from trainthrough.lab.runner import run_silent

    s = run_silent(RunConfig(workload=f"{BUCKETS}:train", paradigm="dp", engine="gloo", ranks=2,
                             strategy=strategy, failures=list(fail), allreduce_buckets=buckets,
                             recovery_delay=0.5, cost=CostModel(timeout_seconds=5)))
    return s.to_dict()  # its counters and the engine's extras, flat


def test_buckets_started_in_the_backward_keep_a_rollback_bit_exact() -> None:
    """Four buckets, started from the backward's hooks (gloo overlaps), train the same
    bits as one; a kill at the second bucket (inside the backward) is rolled back to
    the same bits too (2 ranks, one micro-batch each: every sum has the same order)."""
    one, four = _buckets_run(1), _buckets_run(4)
    hit = _buckets_run(4, fail=("rank=1@iter=3,phase=allreduce:1",))
    assert one["returned"]["steps"] == four["returned"]["steps"] == 8
    assert hit["failures"] == 1 and hit["recoveries"][0]["action"] == "mini-batch-rollback"
    assert hit["replicas_identical"] and four["replicas_identical"]
    assert one["returned"]["sha"] == four["returned"]["sha"] == hit["returned"]["sha"]


def test_lossy_forward_keeps_the_bucket_reduced_in_the_backward_before_a_kill() -> None:
    """A kill at the second of four buckets: the first, reduced with both shares from
    inside the backward, is kept; the survivor, whose backward the loss cut short,
    computes its share again and finishes the step alone."""
    hit = _buckets_run(4, "lossy-forward", ("rank=1@iter=3,phase=allreduce:1",))
    rec = hit["recoveries"][0]
    assert hit["failures"] == 1 and rec["action"] == "lossy-forward" and hit["replicas_identical"]
    assert hit["samples_dropped"] == 16 and rec["perturbation_norm"] > 0
    assert hit["returned"]["steps"] == 8
