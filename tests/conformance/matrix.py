"""The conformance matrix: which (engine, paradigm, strategy, failure form) cells exist,
how to run one, and the invariants every run must keep whatever engine hosts it.

The cells come from the engines' own declarations (``engines/registry.py``), never from
a list kept here: a cell an engine claims is run; a cell it does not claim must be
refused before anything starts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainthrough.config import CostModel, RunConfig
from trainthrough.engines import registry
from trainthrough.faults.spec import parse
from trainthrough.ft.strategy import PRESETS, resolve
from trainthrough.lab.runner import run

CHECKPOINT_EVERY = 10


@dataclass(frozen=True)
class Form:
    """A failure form: its specs (per clock) and how many failures it must inject."""

    name: str
    paradigm: str
    sim: tuple[str, ...]
    real: tuple[str, ...]
    count: int
    chains_only: bool = False  # names a chain position: only chains have one


FORMS = [
    Form("iter", "ps", ("shards=1@iter=35",), ("shards=1@iter=35",), 1),
    Form("time", "ps", ("shards=1@time=0.1s",), ("shards=1@time=1.5s",), 1),
    Form("mtbf", "ps", ("shard=any@mtbf=0.05s,max=2",), ("shard=any@mtbf=1s,max=2",), 2),
    Form("worker", "ps", ("worker=1@iter=35",), ("worker=1@iter=35",), 1),
    Form("during-recovery", "ps", ("shards=1@iter=35", "shards=2@iter=35,phase=recovery"),
         ("shards=1@iter=35", "shards=2@iter=35,phase=recovery"), 2),
    Form("replica", "ps", ("shards=0@iter=35,replica=1",), ("shards=0@iter=35,replica=1",),
         1, chains_only=True),
    Form("iter", "dp", ("rank=1@iter=12",), ("rank=1@iter=12",), 1),
    Form("forward", "dp", ("rank=1@iter=12,phase=forward",),
         ("rank=1@iter=12,phase=forward",), 1),
    Form("allreduce", "dp", ("rank=1@iter=12,phase=allreduce:1",),
         ("rank=1@iter=12,phase=allreduce:1",), 1),
    Form("update", "dp", ("rank=1@iter=12,phase=update",), ("rank=1@iter=12,phase=update",), 1),
    Form("during-recovery", "dp", ("rank=1@iter=12", "rank=2@iter=12,phase=recovery"),
         ("rank=1@iter=12", "rank=2@iter=12,phase=recovery"), 2),
    Form("hang", "dp", ("rank=1@iter=12,mode=hang",), ("rank=1@iter=12,mode=hang",), 1),
]


@dataclass(frozen=True)
class Cell:
    engine: str
    paradigm: str
    strategy: str
    form: Form

    @property
    def id(self) -> str:
        return f"{self.engine}-{self.paradigm}-{self.strategy}-{self.form.name}"

    def specs(self) -> list[str]:
        return list(self.form.sim if self.engine == "sim" else self.form.real)


def claimed(c: Cell) -> bool:
    """Whether the engine claims this cell (the answer validation gives)."""
    if c.form.chains_only and resolve(c.strategy).replication == "none":
        return False
    return registry.claims(c.engine, c.paradigm, resolve(c.strategy),
                           parse(c.specs())) is not None


def all_cells() -> list[Cell]:
    return [Cell(e, f.paradigm, s, f) for e in registry.names() for s, p in PRESETS.items()
            for f in FORMS if f.paradigm in p.paradigms]


# Strategies whose invariants (3, 4 below) are checked on an ``iter`` failure.
_ON_ITER = {"checkpoint-restart", "scar-partial", "checkpoint-sync"}


def covering(cells: list[Cell]) -> list[Cell]:
    """Claimed cells to run: all of them on sim (milliseconds each); on real engines
    (seconds each: actors and processes start) every claimed strategy once and every
    claimed failure form at least once, forms dealt out across the strategies."""
    out = [c for c in cells if c.engine == "sim" and claimed(c)]
    for engine in ("ray", "gloo"):
        for paradigm in ("ps", "dp"):
            mine = [c for c in cells if (c.engine, c.paradigm) == (engine, paradigm)
                    and claimed(c)]
            forms = list(dict.fromkeys(c.form.name for c in mine))
            strategies = list(dict.fromkeys(c.strategy for c in mine))
            todo = [f for f in forms if f != "iter"]
            for s in strategies:
                options = {c.form.name: c for c in mine if c.strategy == s}
                pick = "iter" if s in _ON_ITER else next(
                    (f for f in todo if f in options), "iter")
                if pick in todo:
                    todo.remove(pick)
                out.append(options[pick])
            for f in todo:  # forms no strategy took yet
                out.append(next(c for c in mine if c.form.name == f))
    return out


def config(c: Cell) -> RunConfig:
    """A small run of the cell: long enough for every failure and its recovery."""
    base: dict[str, Any] = dict(engine=c.engine, paradigm=c.paradigm, strategy=c.strategy,
                                failures=c.specs(), seed=3, stop_at_target=False,
                                checkpoint_every=CHECKPOINT_EVERY, eval_every=5)
    if c.paradigm == "ps":
        base.update(workload="mlr", shards=4, workers=2)
        if c.engine == "sim":
            base.update(max_iterations=90)
        else:
            # Few actors (each imports torch): 2 shards, chains of 2.
            base.update(consistency="async", max_iterations=10**6, wall_limit=4.0,
                        recovery_delay=0.2, replicas=2, shards=2)
    else:
        base.update(workload="mlr", ranks=3, max_iterations=40, recovery_delay=0.1)
        if c.engine != "sim":  # a hung rank is found by the collective timeout: short
            base.update(wall_limit=60.0, cost=CostModel(timeout_seconds=2.0))
    return RunConfig(**base)


def run_cell(c: Cell, tmp: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = tmp / c.id
    summary = run(config(c), out)
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    return summary, events


def check(c: Cell, s: dict[str, Any], events: list[dict[str, Any]],
          full_save_payload: int) -> None:
    """The invariants every engine keeps for this cell (asserts)."""
    strategy = resolve(c.strategy)
    fails = [e for e in events if e["type"] == "failure"]
    # 1. The injected failures are the spec's, each recorded.
    assert s["failures"] == c.form.count, (s["failures"], c.form.count)
    assert len(fails) == s["failures"]
    # 2. Every failure was detected and recovered from (real engines: a replacement
    #    process may still be starting when a short run ends; its detection counts).
    detected = [e for e in events if e["type"] in ("detection", "failover")]
    assert s["recoveries"] or (c.engine != "sim" and detected), "no recovery recorded"
    for r in s["recoveries"]:
        assert r["perturbation_norm"] is None or not math.isnan(r["perturbation_norm"]) \
            or c.engine != "sim"
    checkpoints = [e for e in events if e["type"] == "checkpoint"]
    first = fails[0]
    before = [e["iteration"] for e in checkpoints
              if events.index(e) < events.index(first)]
    # 3. checkpoint-restart resumes at the last checkpoint before the failure.
    if strategy.recovery == "rollback-all" and strategy.persist == "sync" and \
            c.form.name in ("iter", "worker") and c.paradigm == "ps" and first["kind"] == "shard":
        rec = s["recoveries"][0]
        assert rec["restored_from"] == (max(before) if before else 0), (rec, before)
        if c.engine == "sim":
            resumed = [e for e in events if e["type"] == "recovery"][0]
            assert resumed["logical_iteration"] == rec["restored_from"]
    # 4. restore-lost leaves survivors untouched (sim: bulk-synchronous, so exactly)
    #    and restores the lost shard from the last checkpoint.
    if strategy.recovery == "restore-lost" and strategy.checkpoint == "full" and \
            strategy.persist == "sync" and c.form.name == "iter":
        rec = s["recoveries"][0]
        assert rec["restored_from"] == (max(before) if before else None), (rec, before)
        if c.engine == "sim":
            assert math.isclose(rec["perturbation_norm"], rec["perturbation_norm_lost"],
                                rel_tol=1e-9)
    # 5. Prioritized saves write no more bytes per N than one full checkpoint.
    if strategy.checkpoint == "prioritized":
        logical = s.get("logical_iterations") or s["iterations"]
        per_n = s["checkpoint_payload_bytes"] / max(1.0, logical / CHECKPOINT_EVERY)
        assert per_n <= full_save_payload * 1.0001, (per_n, full_save_payload)
    # 6. Chain failover loses no acknowledged update.
    if strategy.replication == "chain-sync":
        assert s["acknowledged_lost"] == 0, s.get("acknowledged_lost_detail")
    # 7. Data parallel: the surviving replicas agree bit for bit.
    if c.paradigm == "dp" and "replicas_identical" in s:
        assert s["replicas_identical"]
