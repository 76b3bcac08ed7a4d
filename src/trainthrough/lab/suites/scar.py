"""The SCAR suite: partial recovery and prioritized checkpoints vs checkpoint-restart.

Grid: workloads x fraction of shards lost {25, 50, 75}% x one failure at a fixed
point before convergence x {checkpoint-restart, scar-partial, scar} x seeds, all
with the same checkpoint interval N, so every strategy writes the same checkpoint
bytes (scar writes a fraction r every r*N). Ablation rows run scar with the
``random`` and ``round-robin`` selection rules at 50%. Every run evaluates every
iteration, so rework is exact to one iteration.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainthrough.config import RunConfig
from trainthrough.lab.suite import SuiteRun, SuiteSpec

DESCRIPTION = "SCAR: rework of checkpoint-restart vs partial recovery vs prioritized checkpoints"

# (failure iteration, checkpoint interval N) per workload: the failure strikes 80% of
# the way through an interval, well before convergence.
SETTINGS = {"mlr": (230, 50), "mf": (9, 5), "lda": (9, 5), "cnn": (90, 25)}
# cnn is scored by test loss here: accuracy is a step function, so the iteration at
# which a target accuracy is first met jitters by tens of iterations for reasons that
# have nothing to do with the failure.
OPTIONS: dict[str, dict[str, Any]] = {"cnn": {"metric": "loss"}}
FRACTIONS = ("25%", "50%", "75%")
STRATEGIES = ("checkpoint-restart", "scar-partial", "scar")
ABLATION_RULES = ("random", "round-robin")


def build(quick: bool = False, seeds: int | None = None) -> SuiteSpec:
    n_seeds = seeds or (2 if quick else 5)
    workloads = ("mlr", "mf", "lda") if quick else tuple(SETTINGS)
    fractions = ("50%",) if quick else FRACTIONS
    runs: list[SuiteRun] = []
    for w in workloads:
        at, every = SETTINGS[w]
        for frac in fractions:
            fail = f"shards={frac}@iter={at}"
            cells: list[tuple[str, str, str, float | None]] = [
                (s, s, "largest-change", 0.25) for s in STRATEGIES]
            if frac == "50%":
                cells += [(f"scar/{r}", "scar", r, None) for r in ABLATION_RULES]
                cells += [("scar/r=1/N", "scar", "largest-change", None)]
            for label, strategy, rule, r in cells:
                for seed in range(n_seeds):
                    slug = label.replace("/", "-").replace("=", "").replace("1-N", "1N")
                    run_id = f"{w}-{frac[:-1]}-{slug}-s{seed}"
                    cfg = RunConfig(workload=w, strategy=strategy, failures=[fail], seed=seed,
                                    checkpoint_every=every, checkpoint_rule=rule, eval_every=1,
                                    checkpoint_fraction=r,
                                    checkpoint_dir=f"memory://scar/{run_id}",
                                    workload_options=OPTIONS.get(w, {}))
                    runs.append(SuiteRun(run_id, cfg, {"fail": fail, "fraction": frac,
                                                       "strategy": label, "rule": rule}))
    return SuiteSpec(
        name="scar", title="SCAR suite: rework cost of partial failures", runs=runs,
        group_by=("workload", "fraction", "strategy"),
        notes=["4 shards, 4 workers, bulk-synchronous, sim engine, evaluation every "
               "iteration; rework = iterations to target minus the failure-free run "
               "with the same seed.",
               "Equal checkpoint interval N for every strategy: checkpoint-restart and "
               "scar-partial write a full checkpoint every N, scar a quarter of the bytes "
               "every N/4 (r = 0.25, largest change first), so the payload bytes match; "
               "see the bytes table.",
               "cnn is scored by test loss in this suite (a smooth metric), not accuracy.",
               "Ablation rows: `scar/random` and `scar/round-robin` change only the "
               "selection rule; `scar/r=1/N` spreads the same bytes over every iteration."],
        sections=[bound_section, bytes_section])


def bound_section(suite_dir: Path, rows: list[dict[str, Any]]) -> tuple[str, str]:
    """Scatter of rework vs perturbation norm with the bound, and how often it held."""
    from trainthrough.lab.plots_scar import plot_rework_vs_perturbation

    path = plot_rework_vs_perturbation(rows, suite_dir / "plots" / "rework-vs-perturbation.png")
    lines = ["| workload | runs with a bound | rework <= ceil(bound) | held |",
             "| --- | ---: | ---: | ---: |"]
    for w in dict.fromkeys(r["workload"] for r in rows):
        have = [r for r in rows if r["workload"] == w and r.get("rework_bound") is not None
                and r.get("rework_iterations") is not None]
        held = [r for r in have if r["rework_iterations"] <= math.ceil(r["rework_bound"])]
        share = f"{100 * len(held) / len(have):.0f}%" if have else "n/a"
        lines.append(f"| {w} | {len(have)} | {len(held)} | {share} |")
    body = (f"![rework vs perturbation](plots/{path.name})\n\n"
            "The bound uses the contraction rate fitted on each seed's failure-free run "
            "(lab/bound.py, docs/bound.md); it is not tuned to hold. SGD noise (mlr, cnn), "
            "Gibbs sampling noise (lda) and non-convexity (cnn, mf) break its assumptions, "
            "so it can fail there; the ridge workload meets them exactly and is tested.\n\n"
            + "\n".join(lines))
    return "Rework vs perturbation, and the bound", body


def bytes_section(suite_dir: Path, rows: list[dict[str, Any]]) -> tuple[str, str]:
    """Checkpoint bytes written per workload and strategy (payload and total)."""
    lines = ["| workload | strategy | payload bytes (mean) | all bytes incl. headers (mean) |",
             "| --- | --- | ---: | ---: |"]
    seen: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        seen.setdefault((r["workload"], r["strategy"]), []).append(r)
    for (w, s), rs in seen.items():
        pay = [r.get("checkpoint_payload_bytes") or 0 for r in rs]
        tot = [r.get("checkpoint_bytes") or 0 for r in rs]
        lines.append(f"| {w} | {s} | {sum(pay) / len(pay):,.0f} | {sum(tot) / len(tot):,.0f} |")
    return ("Checkpoint bytes written",
            "Payload is tensor data (values, optimizer state, row indices); the total adds "
            "safetensors headers and manifests, which weigh more for many small partial "
            "saves of a small model.\n\n" + "\n".join(lines))
