"""The cost of distance: data parallel across two hosts, with and without a bandwidth
limit, next to the same run on one host.

Two network namespaces on a veth pair (tests/netns.py; root only) stand for two hosts:
a Ray head and the driver in ``a``, a Ray worker node in ``b``. A 1M-parameter MLP
(benchmarks/_distance_loop.py: ~4 MB of gradients per step) trains on 3 ranks with
rollback; rank 1 is SIGKILLed at step ``--fail-at`` and not replaced. Variants, in
turn within each round (interleaved: the machine is shared and noisy):

- ``one-host``: the gloo engine, 3 rank processes on loopback in namespace ``a``;
- ``two-hosts``: ranks as Ray actors on both namespaces, the veth pair unlimited;
- ``1gbit``, ``100mbit``: the same with a token-bucket limit (``tc qdisc ... tbf``) on
  both ends of the pair. This kernel has no ``netem``, so no delay is added.

Reported per variant (median over rounds): failure-free steps/s (rank 0's steps from
the third to the one before the failure), detection (failure to the first survivor's
collective error) and re-formation (detection to the re-formed group's first commit).

    python benchmarks/distance.py [--rounds 2] [--steps 40] [--fail-at 25]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.loops.two_hosts import ENV, PORT, alive_nodes, node  # noqa: E402
from tests.netns import Hosts, why_not  # noqa: E402

VARIANTS = {"one-host": None, "two-hosts": "", "1gbit": "1gbit", "100mbit": "100mbit"}
LOOP = str(ROOT / "benchmarks" / "_distance_loop.py") + ":train"


def _one(variant: str, hosts: Hosts, fail_at: int) -> dict[str, Any]:
    """One run of ``variant`` (inside namespace ``a``)."""
    from trainthrough.config import CostModel, RunConfig
    from trainthrough.lab.runner import run_silent
    from trainthrough.lab.validate import validate_run

    rate = VARIANTS[variant]
    hosts.limit(rate or None)
    cfg = RunConfig(workload=LOOP, paradigm="dp", ranks=3, strategy="rollback", replace=False,
                    engine="gloo" if rate is None else "ray",
                    ray_address=None if rate is None else f"{hosts.ip['a']}:{PORT}",
                    failures=[f"rank=1@iter={fail_at}"], cost=CostModel(timeout_seconds=5.0))
    validate_run(cfg)
    s = run_silent(cfg)
    ends = s.extras["returned"]["ends"]
    free = ends[2:fail_at - 1]
    return {"steps_per_s": (len(free) - 1) / (free[-1] - free[0]),
            "detect": s.extras["detection_seconds"][0], "reform": s.extras["reform_seconds"][0],
            "params": s.extras["returned"]["params"], "nodes": s.extras.get("rank_nodes")}


def inside(tag: str, rounds: int, fail_at: int) -> None:
    """The driver, in namespace ``a``: every run, interleaved; one JSON line per run."""
    import ray

    hosts = Hosts(tag)
    ray.init(address=f"{hosts.ip['a']}:{PORT}", _node_ip_address=hosts.ip["a"],
             log_to_driver=False, namespace="trainthrough")
    try:
        for r in range(rounds):
            order = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
            for variant in order:
                row = _one(variant, hosts, fail_at)
                print("ROW", json.dumps({"round": r, "variant": variant, **row}), flush=True)
    finally:
        hosts.limit(None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--fail-at", type=int, default=25)
    args = ap.parse_args()
    if (reason := why_not()) is not None:
        print(f"distance: skipped: {reason}")
        return 0
    ENV["TT_DISTANCE_STEPS"] = str(args.steps)
    temp = tempfile.mkdtemp(prefix="ttd-", dir="/tmp")
    hosts = Hosts().create()
    rows: list[dict[str, Any]] = []
    try:
        node(hosts, "a", "--head", f"--port={PORT}", "--include-dashboard=false",
             f"--temp-dir={temp}")
        node(hosts, "b", f"--address={hosts.ip['a']}:{PORT}")
        alive_nodes(hosts, 2)
        t0 = time.time()
        run = subprocess.Popen(hosts.cmd("a", [sys.executable, __file__, "--inside", hosts.tag,
                                               str(args.rounds), str(args.fail_at)]),
                               env=ENV, stdout=subprocess.PIPE, text=True)
        assert run.stdout is not None
        for line in run.stdout:
            if line.startswith("ROW "):
                row = json.loads(line[4:])
                rows.append(row)
                print(f"[{row['round']}] {row['variant']:<10} {row['steps_per_s']:7.2f} steps/s"
                      f"  detection {row['detect'] * 1e3:6.0f} ms  re-formed "
                      f"{row['reform']:.3f} s", flush=True)
        if run.wait() != 0:
            return 1
    finally:
        hosts.close()
        shutil.rmtree(temp, ignore_errors=True)
    base = statistics.median(r["steps_per_s"] for r in rows if r["variant"] == "one-host")
    print(f"\n{rows[0]['params']:,} parameters, 3 ranks, {args.rounds} round(s), "
          f"{time.time() - t0:.0f} s; medians")
    print(f"{'variant':<11}{'steps/s':>9}{'vs one host':>13}{'detection':>12}{'re-formed':>12}")
    for v in VARIANTS:
        rs = [r for r in rows if r["variant"] == v]
        sps = statistics.median(r["steps_per_s"] for r in rs)
        print(f"{v:<11}{sps:>9.2f}{sps / base:>12.2f}x"
              f"{statistics.median(r['detect'] for r in rs) * 1e3:>9.0f} ms"
              f"{statistics.median(r['reform'] for r in rs):>10.3f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--inside":
        inside(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        sys.exit(0)
    sys.exit(main())
