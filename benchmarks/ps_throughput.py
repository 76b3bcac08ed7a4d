"""Parameter-server throughput on Ray vs a bare Ray actor doing the same transport work.

A client pushes the cnn's full gradient and pulls the parameters back, in a loop:
once to a :class:`ShardActor` (dedup, Adam step, version), once to a bare actor
built like it where it matters for transport: threaded (``max_concurrency=8``, so
calls run on a thread pool as ours do), a lock around its state, and ``pull``
returning a copy of the parameters, as ours does so a caller never sees a tensor
change under it. What is left between the two is the parameter server's own work.

Honest by construction: a warm-up of both first, then ``--repeats`` repetitions
whose order alternates (ours first, then the bare actor first), and the ratio of
each repetition printed with the median and spread. Target: ours >= 0.9x bare.

    python benchmarks/ps_throughput.py [--calls 300] [--repeats 6]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import ray
import torch

from trainthrough.engines.ray.actors.shard_actor import ShardActor
from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray
from trainthrough.ps.layout import make_layout
from trainthrough.workloads import make_workload


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=8)
class Bare:
    """Receives pushes and serves copies of its values: transport, no training."""

    def __init__(self, values: dict) -> None:
        torch.set_num_threads(1)
        self.lock = threading.Lock()
        self.values = {n: v.clone() for n, v in values.items()}
        self.n = 0

    def push(self, worker: int, seq: int, update: dict, scale: float) -> int:
        with self.lock:
            self.n += 1
            return self.n

    def pull(self) -> tuple[int, dict]:
        with self.lock:
            return self.n, {n: v.clone() for n, v in self.values.items()}


def loop(actor, update: dict, calls: int, start: int = 1) -> float:  # noqa: ANN001
    """Round trips per second; sequence numbers from ``start`` (ShardActor dedups)."""
    t0 = time.perf_counter()
    for seq in range(start, start + calls):
        ray.get(actor.push.remote(0, seq, update, 1.0))
        ray.get(actor.pull.remote())
    return calls / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error("--repeats must be at least 5")
    torch.set_num_threads(1)
    ensure_ray()
    try:
        wl = make_workload("cnn")
        x0 = wl.init_params(torch.Generator().manual_seed(0))
        layout = make_layout(x0, 1)
        shard = ShardActor.remote(0, layout.shards[0], wl.default_optimizer, x0, "bench")
        bare = Bare.remote(x0)
        update = {n: torch.randn_like(v) * 1e-3 for n, v in x0.items()}
        seq = 1
        for _ in range(2):  # warm-up: both actors up, both code paths hot
            loop(shard, update, 50, seq)
            loop(bare, update, 50)
            seq += 51
        ours, theirs, ratios = [], [], []
        for r in range(args.repeats):
            # ShardActor deduplicates by sequence number: keep them increasing.
            if r % 2 == 0:
                a = loop(shard, update, args.calls, seq)
                b = loop(bare, update, args.calls)
            else:
                b = loop(bare, update, args.calls)
                a = loop(shard, update, args.calls, seq)
            seq += args.calls + 1
            ours.append(a)
            theirs.append(b)
            ratios.append(a / b)
    finally:
        shutdown_ray()
    n = sum(v.numel() for v in x0.values())
    print(f"push+pull round trips of the cnn ({n:,} floats), {args.calls} calls per "
          f"repetition, {args.repeats} repetitions, order alternated")
    print(f"bare Ray actor : {statistics.median(theirs):8.1f} round trips/s "
          f"(min {min(theirs):.1f}, max {max(theirs):.1f})")
    print(f"ShardActor     : {statistics.median(ours):8.1f} round trips/s "
          f"(min {min(ours):.1f}, max {max(ours):.1f})")
    r = statistics.median(ratios)
    print(f"ours / bare    : {r:.3f} median (min {min(ratios):.3f}, max {max(ratios):.3f}; "
          f"each: {' '.join(f'{x:.3f}' for x in ratios)})")
    print(f"target >= 0.9  : {'met' if r >= 0.9 else 'MISSED'}")


if __name__ == "__main__":
    main()
