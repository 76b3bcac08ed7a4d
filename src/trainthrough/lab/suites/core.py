"""The default suite (``make run``): every workload loses half its shards once, late in a
checkpoint interval and well before convergence; no fault tolerance, traditional
checkpoint-restart, SCAR's two improvements and worker-copy recovery, on the same failure
trace."""

from __future__ import annotations

from typing import Any

from trainthrough.config import RunConfig
from trainthrough.lab.suite import SuiteRun, SuiteSpec
from trainthrough.lab.validate import for_strategy

DESCRIPTION = ("every workload, 50% of shards lost once: none, checkpoint-restart, SCAR, "
               "worker-copy")
STRATEGIES = ("none", "checkpoint-restart", "scar-partial", "scar", "worker-copy")
# (failure iteration, checkpoint interval N) per workload, at the workloads' defaults:
# a quick look (`make run`, under 3 minutes). The scar suite runs slower-converging
# settings where checkpoint-restart's rework is 20+ iterations (suites/scar.py).
SETTINGS = {"mlr": (230, 50), "mf": (9, 5), "lda": (9, 5), "cnn": (90, 25)}
# cnn is scored by test loss: accuracy is a step function (see suites/scar.py).
OPTIONS: dict[str, dict[str, Any]] = {"cnn": {"metric": "loss"}}


def build(quick: bool = False, seeds: int | None = None) -> SuiteSpec:
    n_seeds = seeds or (2 if quick else 3)
    workloads = ("mlr", "mf") if quick else tuple(SETTINGS)
    runs = []
    for w in workloads:
        at, every = SETTINGS[w]
        fail = f"shards=50%@iter={at}"
        for strategy in STRATEGIES:
            for seed in range(n_seeds):
                run_id = f"{w}-{strategy}-s{seed}"
                # Each strategy reads its own share (no interval where nothing is saved).
                cfg = for_strategy(RunConfig(workload=w, failures=[fail], seed=seed,
                                             checkpoint_every=every, eval_every=1,
                                             checkpoint_dir=f"memory://core/{run_id}",
                                             workload_options=OPTIONS.get(w, {})), strategy)
                runs.append(SuiteRun(run_id, cfg, {"fail": fail}))
    return SuiteSpec(
        name="core", title="trainthrough core suite: the cost of a partial failure",
        runs=runs,
        notes=["4 shards, 4 workers, bulk-synchronous, sim engine, evaluation every "
               "iteration; rework = iterations to target minus the failure-free run "
               "with the same seed.",
               "Half of the shards are lost once, 80% of the way through a checkpoint "
               "interval, before convergence. All checkpointing strategies write the same "
               "payload bytes. `trainthrough compare --suite scar` runs the full study."])
