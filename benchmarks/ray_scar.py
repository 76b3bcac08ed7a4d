"""SCAR on Ray: prioritized saves for real, and their rework against scar-partial.

Runs mlr in bulk-synchronous rounds on Ray (real actors, a real SIGKILL of half the
shards late in a checkpoint interval) and on sim with the same seeds, for
``scar-partial`` (full checkpoints, lost shards restored) and ``scar`` (prioritized
saves, r of them every r*N): rework against the failure-free run, and the payload
bytes written per N iterations against one full checkpoint.

Usage: ``python benchmarks/ray_scar.py [--seeds 3]`` (about a minute per Ray run).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from trainthrough.config import RunConfig
from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray
from trainthrough.lab.runner import run_baseline, run_silent
from trainthrough.lab.validate import for_strategy

EVERY = 50


def cfg(engine: str, strategy: str, seed: int) -> RunConfig:
    # sim charges its cost model's restart time instead of a real delay
    delay = {"recovery_delay": 0.2} if engine == "ray" else {}
    c = RunConfig(workload="mlr", engine=engine, consistency="bsp", strategy=strategy,
                  shards=4, workers=2, checkpoint_every=EVERY, seed=seed, eval_every=1,
                  failures=["shards=50%@iter=240"], **delay)
    return for_strategy(c, strategy)  # no interval where nothing is saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    if args.seeds < 1:
        print("ray_scar: --seeds must be at least 1", file=sys.stderr)
        return 2
    ensure_ray()
    try:
        rows = []
        full = run_silent(RunConfig(workload="mlr", strategy="checkpoint-restart", shards=4,
                                    workers=2, checkpoint_every=EVERY, max_iterations=EVERY,
                                    stop_at_target=False))
        full_bytes = full.extras["checkpoint_payload_bytes"] / full.checkpoints
        for seed in range(args.seeds):
            base = run_baseline(cfg("sim", "none", seed)).iterations_to_target
            for engine in ("sim", "ray"):  # alternated, same seed
                for strategy in ("scar-partial", "scar"):
                    s = run_silent(cfg(engine, strategy, seed))
                    per_n = s.extras["checkpoint_payload_bytes"] / (s.iterations / EVERY)
                    rows.append((seed, engine, strategy, s.iterations_to_target - base,
                                 per_n / full_bytes, s.wall_seconds))
                    print(f"seed {seed} {engine:<4} {strategy:<13} rework "
                          f"{rows[-1][3]:>4}  bytes per N / full {rows[-1][4]:.3f}  "
                          f"wall {rows[-1][5]:.1f}s", flush=True)
        print()
        for engine in ("sim", "ray"):
            rw = {st: [r[3] for r in rows if r[1] == engine and r[2] == st]
                  for st in ("scar-partial", "scar")}
            mp, ms = statistics.mean(rw["scar-partial"]), statistics.mean(rw["scar"])
            print(f"{engine}: mean rework scar-partial {mp:.1f}, scar {ms:.1f} "
                  f"(scar {'beats' if ms < mp else 'does not beat'} scar-partial; "
                  f"per seed {rw['scar']} vs {rw['scar-partial']})")
    finally:
        shutdown_ray()
    return 0


if __name__ == "__main__":
    sys.exit(main())
