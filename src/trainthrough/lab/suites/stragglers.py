"""The straggler suite: what ``--straggler-deadline`` buys against a slow rank.

Grid (sim engine, mlr, 4 ranks, rollback, steps of 0.5 simulated seconds): rank 1
turns slow (``mode=slow:Fx``) at step 10, F in 2, 4, 8, and the group either waits for
it (no deadline) or drops it at a deadline of 1 s or 0.25 s, a replacement at full
speed joining after ``cost.replace_seconds``; plus the failure-free run. Each run trains
to mlr's target: the measure is its time to target (simulated seconds), against the
failure-free run's.

A deadline below the compute one extra micro-batch costs (0.5 s here: with
``keep-global`` three ranks share four micro-batches) drops a healthy member of the
shrunk group too, again and again: the 0.25 s column shows what that costs.
``--quick``: F in 2 and 8, the 1 s deadline only.
"""

from __future__ import annotations

from typing import Any

from trainthrough.config import CostModel, RunConfig
from trainthrough.lab.suite import SuiteRun, SuiteSpec

DESCRIPTION = "data parallel with a slow rank: time to target with and without a straggler deadline"
FACTORS = (2.0, 4.0, 8.0)
DEADLINES = (1.0, 0.25)
# mlr's 2 ms step scaled to 0.5 s: a deadline in seconds means what it would on a cluster.
COST = CostModel(compute_scale=250)


def build(quick: bool = False, seeds: int | None = None) -> SuiteSpec:
    n_seeds = seeds or 1
    factors = (2.0, 8.0) if quick else FACTORS
    deadlines: tuple[float | None, ...] = (None, 1.0) if quick else (None, *DEADLINES)
    common: dict[str, Any] = dict(workload="mlr", engine="sim", paradigm="dp", ranks=4,
                                  strategy="rollback", cost=COST, max_iterations=20_000)
    runs = []
    for seed in range(n_seeds):
        runs.append(SuiteRun(f"failure-free-s{seed}", RunConfig(seed=seed, **common),
                             {"fail": "failure-free", "slow_factor": 1.0, "deadline": "-"}))
        for f in factors:
            spec = f"rank=1@iter=10,mode=slow:{f:g}x"
            for d in deadlines:
                label = "waits" if d is None else f"{d:g}s"
                runs.append(SuiteRun(f"slow{f:g}x-deadline-{label}-s{seed}",
                                     RunConfig(seed=seed, failures=[spec],
                                               straggler_deadline=d, **common),
                                     {"fail": spec, "slow_factor": f, "deadline": label}))
    return SuiteSpec(
        name="stragglers", title="A slow rank: what the straggler deadline buys",
        runs=runs, group_by=("slow_factor", "deadline"), baseline_strategy="rollback",
        notes=["sim, mlr, 4 ranks, rollback (keep-global), 0.5 s steps; rank 1 slow from "
               "step 10; replacements join 5 s after a drop (cost.replace_seconds)."],
        sections=[section], baselines=False, headline=headline)


def _heading(deadline: str) -> str:
    return "no deadline" if deadline == "waits" else f"deadline {deadline}"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    free = [r["sim_seconds"] for r in rows if r["fail"] == "failure-free"]
    base = sum(free) / len(free) if free else float("nan")
    deadlines = list(dict.fromkeys(r["deadline"] for r in rows if r["fail"] != "failure-free"))
    lines = ["time to target, simulated s (x the failure-free run's "
             f"{base:.0f} s); drops: ranks dropped by the deadline",
             f"{'slow':>6}" + "".join(f"{_heading(d):>24}" for d in deadlines)]
    for f in dict.fromkeys(r["slow_factor"] for r in rows if r["fail"] != "failure-free"):
        cells = []
        for d in deadlines:
            mine = [r for r in rows if r["slow_factor"] == f and r["deadline"] == d]
            t = sum(r["sim_seconds"] for r in mine) / len(mine)
            drops = sum(r["recovery_count"] for r in mine) / len(mine)
            cells.append(f"{t:>9.0f} ({t / base:4.2f}x) {drops:>4.0f} drops")
        lines.append(f"{f:>5g}x" + "".join(f"{c:>24}" for c in cells))
    return lines


def headline(rows: list[dict[str, Any]]) -> str:
    return "\n".join(_table(rows))


def section(suite_dir: Any, rows: list[dict[str, Any]]) -> tuple[str, str]:
    return "Time to target", "```\n" + "\n".join(_table(rows)) + "\n```"
