"""One worker step of each built-in workload, timed: best of ``--repeats`` calls.

The parameter server's workers call ``compute_update`` once per iteration, so its
time bounds every engine's iteration rate. LDA's collapsed Gibbs sweep is the one
that could regress into a Python loop per token: its target is a step under 50 ms
(the suite's budget; it was a timed test, and timings belong here, not in tests).

    PYTHONPATH=src .venv/bin/python benchmarks/workload_step.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from trainthrough.workloads import make_workload

TARGETS = {"lda": 0.05}


def best_step(name: str, repeats: int) -> float:
    w = make_workload(name)
    x = w.init_params(torch.Generator().manual_seed(0))
    (part,) = w.partition(1)
    state = w.init_worker_state(0, part, x, torch.Generator())
    best = float("inf")
    for k in range(repeats):
        t = time.perf_counter()
        w.compute_update(x, part, state, k, k)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    if a.repeats < 1:
        print("workload_step: --repeats must be at least 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # as a worker actor
    missed = 0
    for name in ("mlr", "mf", "lda", "ridge", "cnn"):
        s = best_step(name, a.repeats)
        target = TARGETS.get(name)
        verdict = "" if target is None else (f"  target < {1000 * target:.0f} ms: "
                                             + ("ok" if s < target else "MISSED"))
        missed += target is not None and s >= target
        print(f"{name:6} {1000 * s:8.2f} ms{verdict}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
