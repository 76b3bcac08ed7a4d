"""Start-up of a Ray parameter-server run on a running cluster: cold vs warm actor pool.

Start-up is the time from the engine's start (Ray already up) to the first update
applied, as the run records it (``startup_seconds`` in its summary). The run is the
Training Through Failure suite's: cnn, 1 shard, 4 asynchronous workers,
checkpoint-async, 1.5 s long. Cold: the actor pool is emptied before the run, so
every actor is a new process that imports torch; warm: the run takes the actors the
previous run gave back (engines/ray/pool.py). A warm-up pair runs first, not
counted; then cold and warm alternate (a warm run needs a run before it).

Target: warm <= 3 s.

    python benchmarks/startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from trainthrough.config import RunConfig
from trainthrough.engines.ray.pool import POOL
from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray
from trainthrough.lab.runner import run_silent


def one(cold: bool) -> float:
    if cold:
        POOL.clear()
    cfg = RunConfig(workload="cnn", strategy="checkpoint-async", engine="ray", shards=1,
                    workers=4, consistency="async", stop_at_target=False,
                    max_iterations=10**6, wall_limit=1.5)
    s = run_silent(cfg)
    return float(s["startup_seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    ensure_ray()
    ray_up = time.perf_counter() - t0
    times: dict[str, list[float]] = {"cold": [], "warm": []}
    try:
        one(True), one(False)  # warm-up: Ray's own first-use costs
        for _ in range(args.repeats):
            for kind in ("cold", "warm"):
                times[kind].append(one(kind == "cold"))
    finally:
        shutdown_ray()
    print(f"start-up of a Ray run (cnn, 1 shard, 4 async workers) on a running cluster "
          f"(ray.init took {ray_up:.1f} s, not counted), {args.repeats} repetitions")
    print(f"{'pool':<6}{'median s':>10}{'min s':>8}{'max s':>8}  each")
    for kind, v in times.items():
        each = " ".join(f"{x:.2f}" for x in v)
        print(f"{kind:<6}{statistics.median(v):>10.2f}{min(v):>8.2f}{max(v):>8.2f}  {each}")
    print(f"target: warm <= 3 s: {'met' if max(times['warm']) <= 3 else 'MISSED'}")


if __name__ == "__main__":
    main()
