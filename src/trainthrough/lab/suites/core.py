"""The default suite: every workload, half its shards lost once before convergence,
no fault tolerance vs checkpoint-restart, a few seeds. ``make run`` runs this."""

from __future__ import annotations

from trainthrough.config import RunConfig
from trainthrough.lab.suite import SuiteRun, SuiteSpec

DESCRIPTION = "every workload, 50% of shards lost once: none vs checkpoint-restart"

# Failure point per workload: about 40% of the way to the target failure-free, so
# every strategy has something to lose and time to recover (see README).
FAIL_AT = {"mlr": 230, "mf": 12, "lda": 20, "cnn": 120}
STRATEGIES = ("none", "checkpoint-restart")


def build(quick: bool = False, seeds: int | None = None) -> SuiteSpec:
    n_seeds = seeds or (2 if quick else 3)
    workloads = ("mlr", "mf") if quick else tuple(FAIL_AT)
    runs = []
    for w in workloads:
        fail = f"shards=50%@iter={FAIL_AT[w]}"
        for strategy in STRATEGIES:
            for seed in range(n_seeds):
                run_id = f"{w}-{strategy}-s{seed}"
                cfg = RunConfig(workload=w, strategy=strategy, failures=[fail], seed=seed,
                                checkpoint_dir=f"memory://core/{run_id}")
                runs.append(SuiteRun(run_id, cfg, {"fail": fail}))
    return SuiteSpec(
        name="core", title="trainthrough core suite: the cost of a partial failure",
        runs=runs,
        notes=["4 shards, 4 workers, bulk-synchronous, sim engine; rework = iterations to "
               "target minus the failure-free run with the same seed.",
               "Half of the shards are lost once, about 40% of the way to the target."])
