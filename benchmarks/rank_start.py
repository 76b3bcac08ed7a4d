"""How long a lost rank keeps the group short: ranks forked warm vs started cold.

Two gloo data-parallel runs of mlr on 4 ranks, each with one rank SIGKILLed at a step
boundary, under both ways a local rank can start (``TRAINTHROUGH_RANK_START``):
``fork`` from the warm zygote, and ``exec`` of a fresh ``python -m`` that imports torch
itself. Runs alternate between the two, repeat after repeat, so a load swing on the
machine hits both alike. Measured from the run's own events:

- **rank replacement** (rollback, replacement on): from the failure to the group taking
  the replacement in (``rank-joined``), the group whole again from the next step;
- **process restart** (checkpoint-restart): from the failure to the first step of the
  restarted group (every rank a new process, loaded from the checkpoint);
- the run's wall time from start to end, ranks' start included.

    python benchmarks/rank_start.py [--repeats 3] [--ranks 4]

Prints each run as it ends, then the medians per mode and their ratios (exec / fork).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from typing import Any

from trainthrough.config import RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.lab.runner import run_silent
from trainthrough.lab.validate import for_strategy, validate_run

MODES = ("exec", "fork")


class _Events(Callback):
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def on_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def _after(events: list[dict[str, Any]], start: int, kind: str, **match: Any) -> int:
    return next(i for i in range(start, len(events)) if events[i]["type"] == kind
                and all(events[i].get(k) == v for k, v in match.items()))


def _run(mode: str, strategy: str, ranks: int) -> dict[str, float]:
    """One run; the seconds from the failure to the group training whole again (nan:
    the replacement had not joined when the run ended)."""
    os.environ["TRAINTHROUGH_RANK_START"] = mode
    # Long enough (~10 ms a step) for a cold replacement to import torch and join.
    steps = 1500 if strategy == "rollback" else 120
    cfg = RunConfig(workload="mlr", paradigm="dp", engine="gloo", strategy=strategy,
                    ranks=ranks, replace=True, stop_at_target=False, max_iterations=steps,
                    eval_every=10, checkpoint_every=20, failures=["rank=1@iter=30"])
    cfg = for_strategy(cfg, strategy)  # no interval where nothing is saved
    validate_run(cfg)
    cb = _Events()
    t0 = time.perf_counter()
    run_silent(cfg, cb)
    wall = time.perf_counter() - t0
    ev = cb.events
    fail = _after(ev, 0, "failure")
    try:
        if strategy == "checkpoint-restart":
            back = _after(ev, _after(ev, fail, "restored"), "training-resumed")
        else:  # the joiner trains from the step after the reform that takes it in
            back = _after(ev, fail, "rank-joined")
    except StopIteration:
        return {"back": math.nan, "wall": wall}
    return {"back": ev[back]["wall_seconds"] - ev[fail]["wall_seconds"], "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per mode and strategy")
    ap.add_argument("--ranks", type=int, default=4)
    args = ap.parse_args()
    cases = {"rank replacement": "rollback", "process restart": "checkpoint-restart"}
    out: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(args.repeats):
        for case, strategy in cases.items():
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                m = _run(mode, strategy, args.ranks)
                out.setdefault((case, mode), []).append(m)
                print(f"[{r + 1}/{args.repeats}] {case:<17} {mode:<5} back after "
                      f"{m['back']:6.2f} s   run {m['wall']:6.1f} s", flush=True)
    print(f"\n{'':<18}{'exec (s)':>10}{'fork (s)':>10}{'exec/fork':>11}"
          f"{'run exec':>10}{'run fork':>10}")
    for case in cases:
        med = {mode: statistics.median(m["back"] for m in out[(case, mode)]) for mode in MODES}
        run = {mode: statistics.median(m["wall"] for m in out[(case, mode)]) for mode in MODES}
        print(f"{case:<18}{med['exec']:>10.2f}{med['fork']:>10.2f}"
              f"{med['exec'] / med['fork']:>10.1f}x{run['exec']:>10.1f}{run['fork']:>10.1f}")
    print("\nback: failure to the first step of the whole group (medians of "
          f"{args.repeats}); run: the run's wall time, ranks' start included.")


if __name__ == "__main__":
    main()
