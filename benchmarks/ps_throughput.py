"""Parameter-server throughput on Ray vs a bare Ray actor call with the same payload.

A client pushes the cnn's full gradient (and pulls the parameters back) in a loop:
once to a :class:`ShardActor` (dedup, optimizer step, version), once to a bare
actor whose method receives the same dict of tensors and returns them untouched.
The ratio bare/ours of calls per second is the parameter server's overhead over
Ray itself. Target: our overhead <= 20%.

    python benchmarks/ps_throughput.py [--calls 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
import torch

from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray
from trainthrough.engines.ray.shard_actor import ShardActor
from trainthrough.ps.layout import make_layout
from trainthrough.workloads import make_workload


@ray.remote(num_cpus=0)
class Bare:
    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.n = 0

    def push(self, worker: int, seq: int, update: dict, scale: float) -> int:
        self.n += 1
        return self.n

    def pull(self) -> tuple[int, dict]:
        return self.n, self.values

    def set_values(self, values: dict) -> None:
        self.values = values


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
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ensure_ray()
    try:
        wl = make_workload("cnn")
        x0 = wl.init_params(torch.Generator().manual_seed(0))
        layout = make_layout(x0, 1)
        shard = ShardActor.remote(0, layout.shards[0], wl.default_optimizer, x0, "bench")
        bare = Bare.remote()
        ray.get(bare.set_values.remote({n: v.clone() for n, v in x0.items()}))
        update = {n: torch.randn_like(v) * 1e-3 for n, v in x0.items()}
        loop(shard, update, 20), loop(bare, update, 20)  # warm up
        ours, theirs, ratios = [], [], []
        seq_base = 1000
        for _ in range(args.repeats):
            # ShardActor deduplicates by sequence number: keep them increasing.
            a = loop(shard, update, args.calls, seq_base)
            seq_base += args.calls + 1
            b = loop(bare, update, args.calls)
            ours.append(a)
            theirs.append(b)
            ratios.append(b / a)
    finally:
        shutdown_ray()
    n = sum(v.numel() for v in x0.values())
    print(f"push+pull round trips of the cnn ({n:,} floats), {args.calls} calls, "
          f"median of {args.repeats}")
    print(f"bare Ray actor : {statistics.median(theirs):8.1f} round trips/s")
    print(f"ShardActor     : {statistics.median(ours):8.1f} round trips/s")
    r = statistics.median(ratios)
    print(f"overhead       : {100 * (r - 1):.1f}% (target <= 20%)")


if __name__ == "__main__":
    main()
