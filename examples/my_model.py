r"""Your own model, trained through failures: read this file top to bottom.

An ordinary PyTorch model and data (nothing here is special to trainthrough), then
``build``, the factory trainthrough calls to make the workload, then ``suite``, a
comparison of recovery strategies on this model. The file stays outside the package:
trainthrough imports it by reference (``path/to/file.py:function``) in every process of
a run, the Ray actors included. From the repository root (tests/test_examples.py runs
these very commands):

    # 1. Simulated (deterministic, seconds): the parameters are sharded over 4
    #    parameter-server shards; shard 1 is lost at iteration 20 and training goes on.
    #    --baseline also trains failure-free with the same seed and reports the rework.
    .venv/bin/trainthrough run --workload examples/my_model.py:build --option hidden=32 \
        --fail "shards=1@iter=20" --baseline

    # 2. Real processes on Ray (about a minute): the shard's process is SIGKILLed at
    #    iteration 20, stays down 0.5 s and comes back from its last checkpoint while
    #    the workers keep going.
    .venv/bin/trainthrough run --workload examples/my_model.py:build --engine ray \
        --consistency async --shards 2 --workers 2 --strategy checkpoint-sync \
        --fail "shards=0@iter=20" --recovery-delay 0.5

    # 3. Every recovery strategy on the same failure, side by side: a table, report.md,
    #    report.html and plots in runs/<time>-my-model/.
    .venv/bin/trainthrough compare --suite examples/my_model.py:suite --quick

Each run writes a folder under runs/: events.jsonl shows the failure, its detection,
the recovery and the perturbation it caused; summary.json has every counter.
"""

from pathlib import Path

import torch
import torch.nn as nn

from trainthrough.config import RunConfig
from trainthrough.lab.suite import SuiteRun, SuiteSpec
from trainthrough.workloads.custom import TorchWorkload


def build(seed: int, hidden: int = 16) -> TorchWorkload:
    """The workload. trainthrough passes the run's ``seed`` and every ``--option
    key=value`` as a keyword argument (typed by this signature: ``hidden=32`` is an int).

    ``TorchWorkload`` shards the model's parameters over the parameter server (or
    replicates them over data-parallel ranks with ``--paradigm dp``); each worker pulls
    them, computes the gradient of the loss on its mini-batch and pushes it. See
    src/trainthrough/workloads/custom.py for every argument (loss, metric, optimizer,
    batch size).
    """
    g = torch.Generator().manual_seed(1234)  # the data is fixed; the seed drives training
    x = torch.randn(512, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(1)
    train, test = (x[:400], y[:400]), (x[400:], y[400:])
    model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))
    return TorchWorkload(model, train=train, test=test, name="my-model", target=0.85,
                         seed=seed, eval_every=5, max_iterations=600)


#: This file's workload by reference, absolute: the suite's runs happen in other processes.
WORKLOAD = f"{Path(__file__).resolve()}:build"
STRATEGIES = ("none", "checkpoint-restart", "scar-partial", "scar")


def suite(quick: bool = False, seeds: int | None = None) -> SuiteSpec:
    """Half of the shards lost once, 80% of the way through a checkpoint interval of 20
    iterations (failure-free, the model reaches its target in about 130): no fault
    tolerance, checkpoint-restart, and SCAR's partial recovery with full or prioritized
    checkpoints, on the same failure and seeds. ``trainthrough compare`` passes
    ``quick`` and ``seeds``."""
    fail = "shards=50%@iter=36"
    runs = []
    for strategy in STRATEGIES:
        for seed in range(seeds or (2 if quick else 5)):
            run_id = f"{strategy}-s{seed}"
            cfg = RunConfig(workload=WORKLOAD, strategy=strategy, failures=[fail], seed=seed,
                            # an interval only where the strategy saves (else refused)
                            checkpoint_every=20 if strategy != "none" else None, eval_every=1,
                            checkpoint_dir=f"memory://my-model/{run_id}")
            runs.append(SuiteRun(run_id, cfg, {"fail": fail}))
    return SuiteSpec(name="my-model", title="My model: the cost of losing half the shards",
                     runs=runs, notes=["4 shards, 4 workers, sim engine; rework = iterations "
                                       "to target minus the failure-free run's."])
