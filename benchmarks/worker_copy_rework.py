"""Rework of worker-copy next to checkpoint-restart and scar, in SCAR-suite cells.

Each cell is the SCAR suite's (lab/suites/scar.py: its settings, N, failure 80% of the
way through an interval, r = 0.25 for scar, the same failure-free twin per seed) for
the strategies given; runs are interleaved per seed and the reduction against
checkpoint-restart is printed from means over the same seeds. Until worker-copy is in
the SCAR suite itself, this is how its figures are reproduced:

    .venv/bin/python benchmarks/worker_copy_rework.py --fractions 50% --seeds 2
"""

from __future__ import annotations

import argparse
import statistics
import sys

from trainthrough.config import RunConfig
from trainthrough.lab.rework import rework
from trainthrough.lab.runner import run_baseline, run_silent
from trainthrough.lab.suites.scar import FRACTIONS, SETTINGS, failure_free_twin

STRATEGIES = ("checkpoint-restart", "scar", "worker-copy")


def _reworks(w: str, frac: str, seeds: int) -> dict[str, list[int | None]]:
    st = SETTINGS[w]
    out: dict[str, list[int | None]] = {s: [] for s in STRATEGIES}
    for seed in range(seeds):
        base = None
        for s in STRATEGIES:  # interleaved: every strategy of a seed before the next seed
            cfg = RunConfig(workload=w, strategy=s, failures=[f"shards={frac}@iter={st.fail_at}"],
                            seed=seed, checkpoint_every=st.every, eval_every=st.eval_every,
                            checkpoint_fraction=0.25, checkpoint_rule="largest-change",
                            checkpoint_dir=f"memory://worker-copy-bench/{w}-{s}-{seed}",
                            workload_options=dict(st.options))
            if base is None:
                base = run_baseline(failure_free_twin(cfg))
            out[s].append(rework(run_silent(cfg), base).rework_iterations)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(SETTINGS))
    p.add_argument("--fractions", default=",".join(FRACTIONS))
    p.add_argument("--seeds", type=int, default=2)
    a = p.parse_args(argv)
    workloads, fractions = a.workloads.split(","), a.fractions.split(",")
    bad = [w for w in workloads if w not in SETTINGS] + [f for f in fractions
                                                         if f not in FRACTIONS]
    if bad or a.seeds < 1:
        print(f"worker_copy_rework: unknown {', '.join(bad) or 'seed count'}; workloads: "
              f"{', '.join(SETTINGS)}; fractions: {', '.join(FRACTIONS)}; seeds >= 1",
              file=sys.stderr)
        return 2
    print("workload fraction strategy reworks mean reduction-vs-checkpoint-restart")
    for w in workloads:
        for frac in fractions:
            r = _reworks(w, frac, a.seeds)
            cr = statistics.mean(x for x in r["checkpoint-restart"] if x is not None)
            for s in STRATEGIES:
                vals = [x for x in r[s] if x is not None]
                m = statistics.mean(vals) if vals else float("nan")
                cut = f"{100 * (1 - m / cr):.1f}%" if cr else "n/a"
                print(f"{w} {frac} {s} {r[s]} {m:.2f} {cut}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
