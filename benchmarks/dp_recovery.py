"""Runtime overhead of one data-parallel failure, on real gloo processes and in sim.

For each strategy, mlr on 4 ranks trains exactly L committed steps twice: failure-free
and with one rank SIGKILLed mid-allreduce halfway through a checkpoint interval.
The overhead is the difference in time from the first to the L-th step (process
start-up is left out: it is the same in both runs and varies with the machine's
load). It is split into what the run measured itself (detection latency,
re-formation or restart) and the rest, the work lost, which the model predicts:
rollback redoes at most one step (half a step on average over where the failure
strikes), checkpoint-restart loses the steps since the last checkpoint (half an
interval on average; here exactly half), lossy-forward loses none.

The sim engine then runs the same configurations with its cost model set to the
costs just measured (step time, detection, re-formation, restart): sim's overhead
next to the real one shows how well the simulation stands in for real processes.

    python benchmarks/dp_recovery.py [--steps 150] [--every 50] [--repeats 1]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from trainthrough.config import CostModel, RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.lab import perf_model as pm
from trainthrough.lab.runner import run_silent
from trainthrough.lab.suites.dataparallel import failure_trace
from trainthrough.lab.validate import for_strategy, validate_run
from trainthrough.workloads import make_workload

STRATEGIES = ("rollback", "lossy-forward", "checkpoint-restart")


class _Record(Callback):
    def __init__(self) -> None:
        self.evals: list[dict[str, Any]] = []
        self.failures: list[float] = []

    def after_eval(self, record: dict[str, Any]) -> None:
        self.evals.append(record)

    def on_event(self, event: dict[str, Any]) -> None:
        if event["type"] == "failure":
            self.failures.append(float(event["sim_seconds"]))


def _run(engine: str, strategy: str, steps: int, every: int, fail: bool,
         cost: CostModel) -> dict[str, Any]:
    """One run to exactly ``steps`` committed steps.

    Returns its training seconds (first to last evaluation), its own step time and
    the overhead: for a failure-free run, training seconds minus ``steps`` steps (the
    noise floor); with a failure, the time of the window around it minus the
    committed progress made in it, at the step time measured right around it. Using
    the run's own, local step time keeps machine-load swings out of the overhead.
    """
    specs, extra = failure_trace(strategy, (every + every // 2,), "allreduce:0", every) \
        if fail else ([], 0)
    cfg = RunConfig(workload="mlr", paradigm="dp", engine=engine, strategy=strategy, ranks=4,
                    elastic="keep-local", replace=False, stop_at_target=False,
                    max_iterations=steps + extra, eval_every=10, checkpoint_every=every,
                    failures=specs, cost=cost)
    cfg = for_strategy(cfg, strategy)  # no interval where nothing is saved
    validate_run(cfg)
    cb = _Record()
    s = run_silent(cfg, cb)
    assert s.extras["logical_iterations"] == steps, (strategy, s.extras["logical_iterations"])
    clock = "wall_seconds" if engine == "dist" else "sim_seconds"
    ev = cb.evals
    rates = [(b[clock] - a[clock]) / (b["logical_iteration"] - a["logical_iteration"])
             for a, b in zip(ev, ev[1:])
             if 0 < b["logical_iteration"] - a["logical_iteration"] == b["iteration"] - a["iteration"]
             and not any(a["sim_seconds"] <= t <= b["sim_seconds"] for t in cb.failures)]
    seconds = ev[-1][clock] - ev[0][clock]
    if not cb.failures:
        step = statistics.median(rates)
        return {"seconds": seconds, "step": step, "overhead": seconds - steps * step,
                "summary": s}
    # The window from the last evaluation before the failure to the first one after the
    # run is back to normal steps, priced at the step time measured just around it.
    t = cb.failures[0]
    i = max(k for k, e in enumerate(ev) if e["sim_seconds"] < t)
    j = next(k for k in range(i + 1, len(ev) - 1)
             if ev[k + 1]["iteration"] - ev[k]["iteration"]
             == ev[k + 1]["logical_iteration"] - ev[k]["logical_iteration"] > 0)
    near = [(b[clock] - a[clock]) / (b["logical_iteration"] - a["logical_iteration"])
            for a, b in [*zip(ev[max(0, i - 3):i], ev[max(1, i - 2):i + 1]),
                         *zip(ev[j:j + 3], ev[j + 1:j + 4])]]
    step = statistics.median(near)
    a, b = ev[i], ev[j]
    over = (b[clock] - a[clock]) - (b["logical_iteration"] - a["logical_iteration"]) * step
    return {"seconds": seconds, "step": step, "overhead": over, "summary": s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150, help="committed steps L per run")
    ap.add_argument("--every", type=int, default=50, help="checkpoint interval (steps)")
    ap.add_argument("--repeats", type=int, default=1, help="dist runs per cell (median)")
    args = ap.parse_args()
    dist_cost = CostModel(timeout_seconds=5.0)
    rows = []
    for strategy in STRATEGIES:
        free = [_run("dist", strategy, args.steps, args.every, False, dist_cost)
                for _ in range(args.repeats)]
        hit = [_run("dist", strategy, args.steps, args.every, True, dist_cost)
               for _ in range(args.repeats)]
        noise = statistics.median(r["overhead"] for r in free)
        mid = sorted(hit, key=lambda r: r["overhead"])[len(hit) // 2]
        s = mid["summary"]
        detect = s.extras["detection_seconds"][0]
        rebuild = (s.extras["restart_seconds"] or s.extras["reform_seconds"])[0]
        rows.append({"strategy": strategy, "step": mid["step"], "overhead": mid["overhead"],
                     "detect": detect, "rebuild": rebuild,
                     "blocked": s.checkpoint_blocked_seconds / max(1, s.checkpoints)})
        print(f"[dist] {strategy}: step {mid['step'] * 1e3:.1f} ms, overhead "
              f"{mid['overhead']:.3f} s (failure-free run: {noise:+.3f} s), detection "
              f"{detect * 1e3:.0f} ms, {'restart' if s.extras['restart_seconds'] else 'reform'} "
              f"{rebuild:.3f} s", flush=True)
    w = make_workload("mlr")
    print(f"\n{'strategy':<20}{'dist overhead':>14}{'detect+rebuild':>15}{'lost work':>11}"
          f"{'model lost':>11}{'lost (steps)':>13}{'model':>7}{'sim overhead':>14}"
          f"{'model total':>12}")
    for r in rows:
        step = r["step"]
        c = pm.DPCosts(step_seconds=step, checkpoint_seconds=r["blocked"], mtbf_seconds=1e9,
                       detection_seconds=r["detect"], reform_seconds=r["rebuild"],
                       restart_seconds=r["rebuild"] if r["strategy"] == "checkpoint-restart"
                       else 0.0, read_seconds=0.0)
        model = {"rollback": pm.rollback(c), "lossy-forward": pm.lossy_forward(c),
                 "checkpoint-restart": pm.checkpoint_restart(c, args.every * step)}[r["strategy"]]
        fixed = r["detect"] + r["rebuild"]  # measured by the run itself
        model_total = model.per_failure_seconds
        model_lost = model_total - fixed
        lost = r["overhead"] - fixed
        # Sim with the costs just measured: the same failure, simulated.
        sim_cost = CostModel(compute_scale=step / w.step_seconds, detection_seconds=r["detect"],
                             reform_seconds=r["rebuild"], restart_seconds=r["rebuild"],
                             storage_bandwidth=1e12, replace_seconds=0.0)
        sim = (_run("sim", r["strategy"], args.steps, args.every, True, sim_cost)["seconds"]
               - _run("sim", r["strategy"], args.steps, args.every, False, sim_cost)["seconds"])

        print(f"{r['strategy']:<20}{r['overhead']:>13.3f}s{fixed:>14.3f}s{lost:>10.3f}s"
              f"{model_lost:>10.3f}s{lost / step:>13.1f}{model_lost / step:>7.1f}"
              f"{sim:>13.3f}s{model_total:>11.3f}s")
    print("\nlost work = overhead - detection - re-formation (or restart); model lost: half a "
          "step (rollback), half a checkpoint interval (checkpoint-restart), none (lossy-forward).")


if __name__ == "__main__":
    main()
