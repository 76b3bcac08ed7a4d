"""Failure-free overhead of each strategy on Ray, as throughput relative to no fault tolerance.

Each strategy trains cnn on Ray (1 shard, 4 asynchronous workers) for the same
wall time with no failure; throughput is updates applied per second once the
actors are up. Strategies alternate within each repetition so the machine's noise
hits them alike; the ratio printed is the median over repetitions of
strategy/none. Target: checkpoint-async costs at most 3% (CheckFreq reports 3.5%).

    python benchmarks/overhead.py [--seconds 20] [--repeats 3] [--checkpoint-every 25]
"""

from __future__ import annotations

import argparse
import statistics

from trainthrough.config import RunConfig
from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray
from trainthrough.lab.runner import run_silent

STRATEGIES = ("none", "checkpoint-sync", "checkpoint-async", "chain-sync", "chain-async",
              "stateless")


def throughput(strategy: str, seconds: float, every: int) -> float:
    cfg = RunConfig(workload="cnn", strategy=strategy, engine="ray", shards=1, workers=4,
                    consistency="async", checkpoint_every=every, eval_every=10**6,
                    stop_at_target=False, max_iterations=10**7, wall_limit=seconds)
    s = run_silent(cfg)
    return s["updates_applied"] / s["wall_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--checkpoint-every", type=int, default=25)
    args = ap.parse_args()
    ensure_ray()
    rates: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    ratios: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    try:
        for _ in range(args.repeats):
            this = {s: throughput(s, args.seconds, args.checkpoint_every) for s in STRATEGIES}
            for s in STRATEGIES:
                rates[s].append(this[s])
                ratios[s].append(this[s] / this["none"])
    finally:
        shutdown_ray()
    print(f"failure-free throughput on Ray: cnn, 1 shard, 4 async workers, "
          f"{args.seconds:g} s per run, checkpoint every {args.checkpoint_every}, "
          f"median of {args.repeats}")
    print(f"{'strategy':<18}{'updates/s':>11}{'vs none':>10}{'overhead':>10}")
    for s in STRATEGIES:
        r = statistics.median(ratios[s])
        print(f"{s:<18}{statistics.median(rates[s]):>11.1f}{r:>10.3f}{100 * (1 - r):>9.1f}%")
    print("target: checkpoint-async overhead <= 3%")


if __name__ == "__main__":
    main()
