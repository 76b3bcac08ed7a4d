"""The relaxed-synchronization suite: synchronous DDP recovery next to LocalSGD and DiLoCo.

Grid (sim engine, 4 ranks, mlr): {checkpoint-restart, rollback, lossy-forward,
localsgd, diloco, streaming-diloco} x a failure rate (one MTBF trace per rate, the same
seeded ``rank=any@mtbf=`` spec for every strategy, plus no failures) x seeds. Every
run trains ``L`` steps of the same global batch size (keep-global), relaxed strategies
with ``H`` = ``sync_every`` inner steps between outer steps (streaming: 2 fragments).

Measured per run (report in :mod:`relaxed_report`):

- goodput: committed samples per simulated second over the same strategy's
  failure-free run (same seed); committed: in a committed step (synchronous; lossy
  forward's dropped share excluded), or in a replica's local steps that reached an
  outer step (relaxed; a lost replica's steps since its last outer step excluded);
- time to target: simulated seconds until the workload's target was first reached;
- bytes communicated per committed sample (every allreduce, as a ring, all ranks);
- final test accuracy, and its difference to the strategy's failure-free run.
"""

from __future__ import annotations

from trainthrough.config import CostModel, RunConfig
from trainthrough.lab.suite import SuiteRun, SuiteSpec
from trainthrough.lab.suites.relaxed_report import goodput_section, headline
from trainthrough.lab.validate import for_strategy

DESCRIPTION = ("data parallel: synchronous recovery (checkpoint-restart, rollback, "
               "lossy-forward) vs LocalSGD / DiLoCo / streaming DiLoCo on the same MTBF trace")
SYNC = ("checkpoint-restart", "rollback", "lossy-forward")
RELAXED = ("localsgd", "diloco", "streaming-diloco")
# The data-parallel suite's costs (measured on gloo here): detection 0.03 s,
# re-formation 0.3 s, restart 3 s, a replacement after 1 s; compute x10.
COST = CostModel(compute_scale=10.0, detection_seconds=0.03, reform_seconds=0.3,
                 restart_seconds=3.0, replace_seconds=1.0)
STEPS = {False: 1000, True: 800}  # L per run: quick or not
# Mean simulated seconds between failures of some rank (None: no failures); a
# failure-free run of L=1000 steps takes about 20 s.
MTBF = {False: (None, 16.0, 8.0, 4.0, 2.0, 1.0), True: (None, 8.0, 2.0)}
SYNC_EVERY = 10
CHECKPOINT_EVERY = 100


def build(quick: bool = False, seeds: int | None = None) -> SuiteSpec:
    n_seeds = seeds or (1 if quick else 3)
    steps = STEPS[quick]
    runs: list[SuiteRun] = []
    for mtbf in MTBF[quick]:
        fail = "none" if mtbf is None else f"mtbf {mtbf:g}s"
        for strategy in (*SYNC, *RELAXED):
            for seed in range(n_seeds):
                run_id = f"mlr-{strategy}-{'free' if mtbf is None else f'mtbf{mtbf:g}'}-s{seed}"
                cfg = for_strategy(RunConfig(
                    workload="mlr", paradigm="dp", ranks=4, seed=seed, max_iterations=steps,
                    stop_at_target=False, eval_every=25, checkpoint_every=CHECKPOINT_EVERY,
                    cost=COST, failures=[] if mtbf is None else [f"rank=any@mtbf={mtbf:g}s"],
                    checkpoint_dir=f"memory://relaxed-suite/{run_id}", sync_every=SYNC_EVERY),
                    strategy)
                runs.append(SuiteRun(run_id, cfg, {
                    "fail": fail, "mtbf": mtbf if mtbf is not None else "",
                    "family": "relaxed" if strategy in RELAXED else "synchronous",
                    "steps": steps}))
    return SuiteSpec(
        name="relaxed",
        title="Relaxed synchronization: goodput against failure rate", runs=runs,
        group_by=("workload", "fail", "strategy"), baseline_strategy="rollback",
        baselines=False, sections=[goodput_section], headline=headline,
        notes=[f"4 ranks, sim engine, mlr, {n_seeds} seed(s); every run trains L={steps} steps "
               f"of a 4 x batch_size global batch; relaxed: H={SYNC_EVERY} inner steps per outer "
               "step (streaming-diloco: 2 fragments), DiLoCo's outer optimizer Nesterov SGD "
               "(lr 0.7, momentum 0.9).",
               "Failures: one seeded trace per rate (rank=any@mtbf=T, simulated seconds), the "
               "same for every strategy; a replacement joins after 1 s (relaxed: at the next "
               "outer step). Costs: detection 0.03 s, re-formation 0.3 s, restart 3 s, "
               f"checkpoints every {CHECKPOINT_EVERY} steps (checkpoint-restart), compute x10.",
               "Goodput: committed samples per simulated second over the same strategy's "
               "failure-free run, same seed."])
