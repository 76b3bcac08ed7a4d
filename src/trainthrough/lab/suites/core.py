"""The default suite (``make run``): the headline of what each recovery saves.

Every workload loses half its shards once, 80% of the way through a checkpoint interval;
no fault tolerance, traditional checkpoint-restart, SCAR's two improvements and
worker-copy recovery run on the same failure trace, five seeds each.

The workloads run at the SCAR suite's settings (:data:`~.scar.SETTINGS`), not at their
defaults: at the defaults mf and lda converge in about a dozen iterations, a failure
costs 0-4 iterations whatever the strategy, and a reduction of rework is a ratio of
noise. At these settings checkpoint-restart's rework is 20-40 iterations, so a reduction
is a ratio of numbers well above the one-iteration resolution, and every reduction
carries its 95% interval (lab/intervals.py): a row whose interval reaches 0 reads "no
difference measured" instead of a percentage. SCAR's published 78-95% stands beside
``scar``'s figure for the workloads the paper covers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainthrough.config import RunConfig
from trainthrough.lab.suite import SuiteRun, SuiteSpec
from trainthrough.lab.suites.scar import BASELINE, SETTINGS, failure_free_twin
from trainthrough.lab.validate import for_strategy

DESCRIPTION = ("the headline: every workload, 50% of shards lost once, 5 seeds with 95% "
               "intervals: none, checkpoint-restart, SCAR, worker-copy")
STRATEGIES = ("none", "checkpoint-restart", "scar-partial", "scar", "worker-copy")
FRACTION = "50%"
#: seeds: the headline's and --quick's (3 is the fewest a t interval is worth printing)
SEEDS, QUICK_SEEDS = 5, 3
#: what ``--quick`` runs: the two workloads whose runs are shortest and least noisy here
QUICK_WORKLOADS = ("mlr", "mf")
#: SCAR's published reduction of rework against checkpoint-restart (ICML 2019), for the
#: workloads its paper trains (MLR, matrix factorization, LDA); cnn is not among them
PAPER = "78-95%"
PAPER_WORKLOADS = ("mlr", "mf", "lda")
PAPER_STRATEGY = "scar"


def paper_figure(workload: str, strategy: str) -> str:
    """What the SCAR paper reports for this row (a dash where it reports nothing)."""
    if strategy == BASELINE:
        return "baseline"
    if strategy == PAPER_STRATEGY and workload in PAPER_WORKLOADS:
        return PAPER
    return "-"


def _paper_cell(row: dict[str, Any]) -> str:
    return paper_figure(str(row.get("workload")), str(row.get("strategy")))


def _twin(cfg: RunConfig) -> RunConfig:
    """One failure-free twin per (workload, seed) for every strategy, ``none`` (which
    reads no checkpoint interval) included: without failures they train alike."""
    return failure_free_twin(replace(cfg, checkpoint_every=SETTINGS[cfg.workload].every))


def build(quick: bool = False, seeds: int | None = None) -> SuiteSpec:
    n_seeds = seeds or (QUICK_SEEDS if quick else SEEDS)
    workloads = QUICK_WORKLOADS if quick else tuple(SETTINGS)
    runs = []
    for w in workloads:
        st = SETTINGS[w]
        fail = f"shards={FRACTION}@iter={st.fail_at}"
        for strategy in STRATEGIES:
            for seed in range(n_seeds):
                run_id = f"{w}-{strategy}-s{seed}"
                # Each strategy reads its own share (no interval where nothing is saved).
                cfg = for_strategy(RunConfig(workload=w, failures=[fail], seed=seed,
                                             checkpoint_every=st.every,
                                             eval_every=st.eval_every,
                                             checkpoint_dir=f"memory://core/{run_id}",
                                             workload_options=dict(st.options)), strategy)
                runs.append(SuiteRun(run_id, cfg, {"fail": fail}))
    described = "; ".join(f"{w}: N={SETTINGS[w].every}, failure at {SETTINGS[w].fail_at}"
                          + "".join(f", {k}={v}" for k, v in SETTINGS[w].options.items())
                          for w in workloads)
    return SuiteSpec(
        name="core", title="trainthrough core suite: the cost of a partial failure",
        runs=runs, columns=(("SCAR paper", _paper_cell),), intervals=True, baseline_of=_twin,
        notes=[f"4 shards, 4 workers, bulk-synchronous, sim engine; {n_seeds} seeds per "
               "row; rework = iterations to target minus the failure-free run with the "
               "same seed, exact to one iteration.",
               f"Settings ({described}), the SCAR suite's: checkpoint-restart's rework is "
               "tens of iterations, well above the measurement's resolution.",
               "Reductions carry Fieller's 95% interval, paired by seed (lab/intervals.py); "
               "*no difference measured*: the interval reaches 0, so these seeds cannot "
               "tell the strategy from checkpoint-restart.",
               "Rework can be below 0: it is the difference between two runs (the recovered "
               "one and its failure-free twin), and a perturbation can by chance bring a run "
               "to its target sooner. A mean rework whose interval spans 0 is a failure "
               "that cost nothing measurable.",
               f"*SCAR paper*: the reduction SCAR reports against checkpoint-restart "
               f"({PAPER}, for {', '.join(PAPER_WORKLOADS)}; the paper trains no cnn), "
               "beside our `scar` row. `trainthrough compare --suite scar` runs the full "
               "study (25/50/75% lost, 10 seeds, ablations)."])
