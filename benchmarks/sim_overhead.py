"""Engine overhead: MLR for 1,000 iterations through the sim engine vs a hand-written loop.

Both do the same math on the same data: 4 workers each compute the mini-batch
gradient of multinomial logistic regression on their partition, the gradients are
averaged and one SGD step is taken. The engine adds what makes it an engine:
4 shards (split and assemble), the virtual clock, failure checks, the checkpoint
policy and callbacks. Runs alternate so machine noise hits both alike; the ratio
printed is the median over repetitions. Target: engine/hand <= 1.25.

    python benchmarks/sim_overhead.py [--iterations 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trainthrough.config import RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.lab.runner import build_engine, resolve_defaults
from trainthrough.workloads.mlr import MLR


def hand_loop(iterations: int, seed: int) -> tuple[float, torch.Tensor]:
    """The same training written directly in PyTorch."""
    wl = MLR(seed=seed)
    parts = wl.partition(4)
    params = wl.init_params(torch.Generator().manual_seed(seed))
    w, b = params["W"].clone(), params["b"].clone()
    lr, l2 = wl.default_optimizer.lr, wl.l2
    t0 = time.perf_counter()
    for step in range(iterations):
        gw, gb = torch.zeros_like(w), torch.zeros_like(b)
        for part in parts:
            idx = part.batches.indices(step)
            x, y = part.x[idx], part.y[idx]
            p = torch.softmax(x @ w + b, dim=1)
            p[torch.arange(len(y)), y] -= 1.0
            p /= len(y)
            gw += x.T @ p + l2 * w
            gb += p.sum(0)
        w -= lr * gw / 4
        b -= lr * gb / 4
    return time.perf_counter() - t0, w


def engine_loop(iterations: int, seed: int) -> tuple[float, torch.Tensor]:
    cfg = RunConfig(workload="mlr", strategy="none", shards=4, workers=4, seed=seed,
                    max_iterations=iterations, eval_every=iterations, stop_at_target=False)
    cfg, wl = resolve_defaults(cfg)
    engine = build_engine(cfg, wl, Callback(), "memory://bench")
    t0 = time.perf_counter()
    engine.run()
    # run() evaluates at iteration 0 and at the end; time those evaluations out.
    elapsed = time.perf_counter() - t0
    t1 = time.perf_counter()
    wl.evaluate(engine.cluster.params())
    elapsed -= 2 * (time.perf_counter() - t1)
    return elapsed, engine.cluster.params()["W"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine_loop(50, 0), hand_loop(50, 0)  # warm up imports and allocators
    ratios, hands, engines = [], [], []
    for r in range(args.repeats):
        h, wh = hand_loop(args.iterations, r)
        e, we = engine_loop(args.iterations, r)
        assert torch.allclose(wh, we, atol=1e-5), "engine and hand loop diverged"
        hands.append(h)
        engines.append(e)
        ratios.append(e / h)
    print(f"MLR, 4 shards x 4 workers, {args.iterations} iterations, {args.repeats} repeats")
    print(f"hand-written loop : {statistics.median(hands) * 1e3:8.1f} ms (median)")
    print(f"sim engine        : {statistics.median(engines) * 1e3:8.1f} ms (median)")
    print(f"engine/hand ratio : {statistics.median(ratios):.3f} (target <= 1.25; "
          f"min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
