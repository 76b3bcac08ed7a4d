"""Data-parallel recovery with ranks on Ray actors, next to the gloo engine's processes.

Both hosts run the same controller, step and policies; only how a rank process starts
and dies differs (a Ray actor vs a process started with ``python -m``). For each
strategy, mlr on 4 ranks loses rank 1 mid-allreduce at step 30, on gloo and on Ray,
interleaved (the machine is shared and noisy). Reported per host, the median and the
worst over the repeats:

- detection: from the failure (the victim's own report, just before it dies) to the
  first survivor's collective error;
- re-formation: from detection to the re-formed group's first commit of state
  (``reform``; for checkpoint-restart, ``restart``: until the fresh ranks resume);
- wall/it: the run's wall seconds per iteration, process start-up included (how much
  a host costs around the steps; not the step time).

Targets (issue 10): detection <= 1 s and group re-formed <= 2 s on Ray.

    python benchmarks/dp_ray_recovery.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from trainthrough.config import CostModel, RunConfig
from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray
from trainthrough.lab.runner import run_silent
from trainthrough.lab.validate import for_strategy, validate_run

STRATEGIES = ("rollback", "lossy-forward", "checkpoint-restart")
HOSTS = ("gloo", "ray")


def _run(engine: str, strategy: str) -> dict[str, Any]:
    cfg = RunConfig(workload="mlr", paradigm="dp", engine=engine, strategy=strategy, ranks=4,
                    replace=False, stop_at_target=False, max_iterations=60, eval_every=10,
                    checkpoint_every=20, failures=["rank=1@iter=30,phase=allreduce:0"],
                    cost=CostModel(timeout_seconds=5.0))
    cfg = for_strategy(cfg, strategy)  # no interval where nothing is saved
    validate_run(cfg)
    s = run_silent(cfg)
    rebuild = s.extras["restart_seconds"] or s.extras["reform_seconds"]
    return {"detect": s.extras["detection_seconds"][0], "rebuild": rebuild[0],
            "per_it": s.wall_seconds / max(1, s.iterations)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    started = ensure_ray()  # one Ray for every run: its start-up is not what is measured
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        for rep in range(args.repeats):
            for strategy in STRATEGIES:
                for host in HOSTS if rep % 2 == 0 else HOSTS[::-1]:  # interleaved
                    r = _run(host, strategy)
                    rows.setdefault((host, strategy), []).append(r)
                    print(f"[{rep}] {host:<5}{strategy:<20} detection {r['detect'] * 1e3:6.0f} ms"
                          f"  re-formed {r['rebuild']:.3f} s", flush=True)
    finally:
        if started:
            shutdown_ray()
    print(f"\n{'host':<6}{'strategy':<20}{'detection median/max':>22}"
          f"{'re-formed median/max':>22}{'wall/it':>10}")
    worst = {"detect": 0.0, "reform": 0.0}
    for (host, strategy), rs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        d = [r["detect"] for r in rs]
        b = [r["rebuild"] for r in rs]
        st = statistics.median(r["per_it"] for r in rs)
        print(f"{host:<6}{strategy:<20}{statistics.median(d) * 1e3:>12.0f} /{max(d) * 1e3:>5.0f} ms"
              f"{statistics.median(b):>13.3f} /{max(b):>6.3f} s{st * 1e3:>7.1f}ms")
        if host == "ray":
            worst["detect"] = max(worst["detect"], max(d))
            if strategy != "checkpoint-restart":
                worst["reform"] = max(worst["reform"], max(b))
    ok_d, ok_r = worst["detect"] <= 1.0, worst["reform"] <= 2.0
    print(f"\nRay, worst over every run: detection {worst['detect']:.3f} s (target <= 1 s: "
          f"{'met' if ok_d else 'MISSED'}), group re-formed {worst['reform']:.3f} s "
          f"(target <= 2 s: {'met' if ok_r else 'MISSED'}; restarts are not re-formations)")


if __name__ == "__main__":
    main()
