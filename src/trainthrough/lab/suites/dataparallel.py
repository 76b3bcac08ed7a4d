"""The data-parallel suite: accuracy loss against runtime overhead (Nicolae et al., CCGrid'22).

Grid (sim engine, 4 ranks): cnn and mlr x a failure phase (forward, backward,
allreduce:1, update) x 1 or 3 failures x {checkpoint-restart, rollback,
lossy-forward} x {keep-global, keep-local} x seeds, plus one failure-free run per
workload and seed. Checkpoint-restart always restarts all N ranks, so the elastic
policy changes nothing for it and it runs once per cell.

Every run trains exactly ``L`` committed steps (the same global batches as the
failure-free run, as the paper compares at a fixed number of epochs): the iteration
budget is set per run to ``L`` plus the attempts a strategy loses (rollback: the
interrupted attempt, none at ``update``, after the commit; checkpoint-restart: that attempt plus the steps since the last
checkpoint; lossy-forward: none). Failures strike at the same *logical* step for
every strategy, at 20%, 50% and 80% of a checkpoint interval (one failure: 50%), so
checkpoint-restart loses half an interval on average, as the model assumes.

Accuracy loss = test accuracy of the failure-free run minus the run's (points);
overhead = simulated seconds minus the failure-free run's, same seed.
"""

from __future__ import annotations

from trainthrough.config import RunConfig
from trainthrough.lab.suite import SuiteRun, SuiteSpec
from trainthrough.lab.suites.dataparallel_cost import COST
from trainthrough.lab.suites.dataparallel_report import headline, model_section, tradeoff_section
from trainthrough.lab.validate import for_strategy

DESCRIPTION = ("data parallel: accuracy loss vs runtime overhead of checkpoint-restart, "
               "rollback, lossy-forward (keep-global/keep-local)")
PHASES = ("forward", "backward", "allreduce:1", "update")
STRATEGIES = ("checkpoint-restart", "rollback", "lossy-forward")
ELASTIC = ("keep-global", "keep-local")
# workload -> (L committed steps, checkpoint interval, 1-failure step, 3-failure steps)
FULL = {"cnn": (160, 40, (60,), (8, 60, 112)),
        "mlr": (400, 100, (150,), (20, 150, 280))}
QUICK = {"cnn": (80, 20, (30,), (4, 30, 56)),
         "mlr": (400, 100, (150,), (20, 150, 280))}


def failure_trace(strategy: str, steps: tuple[int, ...], phase: str, every: int
                  ) -> tuple[list[str], int]:
    """Failure specs striking at committed steps ``steps``, and the extra attempts.

    The sim engine fires ``@iter=`` on executed attempts; each strategy loses a
    different number of them before the next failure, so the trigger is shifted by
    what was lost so far. Victims are ranks 1, 2, 3 (never one still being replaced).
    """
    specs, extra = [], 0
    for i, step in enumerate(steps):
        specs.append(f"rank={1 + i % 3}@iter={step + extra},phase={phase}")
        if strategy == "rollback" and phase != "update":  # after the commit: no redo
            extra += 1
        elif strategy == "checkpoint-restart":
            extra += 1 + step % every
    return specs, extra


def build(quick: bool = False, seeds: int | None = None) -> SuiteSpec:
    n_seeds = seeds or (1 if quick else 3)
    settings = QUICK if quick else FULL
    phases = ("allreduce:1", "update") if quick else PHASES
    runs: list[SuiteRun] = []
    for w, (steps, every, one, three) in settings.items():
        # Four buckets, so allreduce:1 strikes a partly reduced gradient (lossy forward
        # keeps the share of the bucket already reduced).
        common = dict(workload=w, paradigm="dp", ranks=4, stop_at_target=False, eval_every=25,
                      checkpoint_every=every, cost=COST, allreduce_buckets=4)
        for seed in range(n_seeds):
            run_id = f"{w}-failure-free-s{seed}"
            runs.append(SuiteRun(run_id, for_strategy(RunConfig(seed=seed, max_iterations=steps,
                                                                 **common),  # type: ignore[arg-type]
                                                       "lossy-forward"),
                                 {"fail": "none", "strategy": "failure-free",
                                  "preset": "failure-free", "elastic": "-", "phase": "-",
                                  "failures_planned": 0, "steps": steps, "every": every}))
        for phase in phases:
            for count, at in ((1, one), (3, three)):
                for strategy in STRATEGIES:
                    specs, extra = failure_trace(strategy, at, phase, every)
                    policies = ("keep-global",) if strategy == "checkpoint-restart" else ELASTIC
                    for elastic in policies:
                        label = strategy if strategy == "checkpoint-restart" else \
                            f"{strategy}/{elastic}"
                        for seed in range(n_seeds):
                            run_id = (f"{w}-{phase.replace(':', '')}-x{count}-"
                                      f"{label.replace('/', '-')}-s{seed}")
                            cfg = for_strategy(RunConfig(
                                elastic=elastic, seed=seed, failures=specs,
                                max_iterations=steps + extra,
                                checkpoint_dir=f"memory://dp-suite/{run_id}",
                                **common), strategy)  # type: ignore[arg-type]
                            runs.append(SuiteRun(run_id, cfg, {
                                "fail": f"{count}x {phase}", "strategy": label,
                                "preset": strategy, "elastic": elastic, "phase": phase,
                                "failures_planned": count, "steps": steps,
                                "every": every}))
    return SuiteSpec(
        name="dataparallel",
        title="Data-parallel suite: accuracy loss vs runtime overhead", runs=runs,
        group_by=("workload", "fail", "strategy"), baseline_strategy="failure-free",
        baselines=False, sections=[tradeoff_section, model_section], headline=headline,
        notes=[f"4 ranks, sim engine, {n_seeds} seed(s); every run trains exactly L committed "
               "steps (" + ", ".join(f"{w}: L={s[0]}, checkpoint every {s[1]}"
                                     for w, s in settings.items()) + ").",
               "Accuracy loss: failure-free test accuracy minus the run's, same seed, in "
               "points; overhead: simulated seconds beyond the failure-free run.",
               "Costs: detection 0.03 s, re-formation 0.3 s, restart 3 s, replacement after "
               "1 s (measured on gloo here, benchmarks/dp_recovery.py), compute x10.",
               "checkpoint-restart restarts every rank, so it has no elastic variant.",
               "Rework columns are empty: runs are compared at equal training progress, "
               "not at a target (see the sections below)."])
