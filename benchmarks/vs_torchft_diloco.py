"""trainthrough's DiLoCo next to torchft 0.2.0's DiLoCo, and our synchronous rollback,
on the same model, replicas, H, outer optimizer and kills, interleaved.

The training: trainthrough's ``cnn`` on the bundled 8x8 digits, 32 samples per replica
per step, ``--steps`` inner steps, N replicas (``--replicas``, 2 by default: see
vs_torchft.py on why more measure the scheduler on 2 cores) over gloo on 127.0.0.1.

- torchft: ``_torchft_diloco_replica.py``, one process per replica group, a
  ``Manager`` with a synchronous quorum, ``DiLoCo`` with Adam (1e-3) inside and SGD
  with Nesterov momentum (lr 0.7, momentum 0.9) outside, every ``--sync-every`` steps;
  its lighthouse on 127.0.0.1 (heartbeat timeout ``--heartbeat-ms``); a killed replica
  is started again at once and heals from its peer.
- trainthrough DiLoCo: ``--strategy diloco`` on the gloo engine with the same H, outer
  optimizer (its defaults) and Adam (the cnn workload's), ``elastic=keep-local``, the
  replacement started at once; it joins at the next outer step.
- trainthrough rollback: the synchronous step with mini-batch rollback, the same kills
  (``phase=allreduce:0``, the interrupted step redone).

The kills: replica 1 SIGKILLs itself at the inner steps ``--kills`` (or every
``--kill-every`` steps), before that step's update (trainthrough: ``phase=inner``).

Reported per system, median [min-max] over ``--repeats``, each system run failure-free
and with the kills, in alternating order every repetition:
- free steps/s: inner steps committed per second, failure-free run, from step 10;
- steps/s with kills (torchft: an outer step counts H steps once committed; a discarded
  one counts nothing), and goodput: samples/s with kills over the same system's free
  samples/s, samples/s being steps/s times the mean share of the N replicas in a
  committed step (a replica alone trains half the samples of a step, and on 2 cores
  faster: steps/s alone would flatter every system);
- accuracy on the held-out digits at the end, failure-free and with kills.
Steps/s come from commit times: torchft's at each outer step, trainthrough's at its
evaluations (every ``EVAL_EVERY`` steps, a multiple of H).

A killed torchft replica comes back as a new process (2-3 s here: Python, torch,
torchft), while trainthrough's replacement is forked warm (0.1-0.4 s); in a short run the
survivor trains alone meanwhile, or to the end (the "by all N" column), and a restarted
replica that finds nobody left trains on alone after the survivor's last step, which the
figures leave out (a run ends at the first replica's final record). Runs of a few seconds
therefore measure mostly that start-up; the claim needs minutes.

    python benchmarks/vs_torchft_diloco.py [--steps 1500] [--sync-every 10]
        [--kills 300] [--kill-every N] [--repeats 3] [--replicas 2] [--no-torchft]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_torchft as base  # noqa: E402
from _torchft_run import TorchftSettings  # noqa: E402
from trainthrough.config import CostModel, RunConfig  # noqa: E402
from trainthrough.lab.runner import run_silent  # noqa: E402
from trainthrough.lab.validate import validate_run  # noqa: E402

EVAL_EVERY = 50
TIMEOUT = 5.0
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # trainthrough's diloco defaults (config.py)


@dataclass
class Figures:
    steps_per_s: float | None
    accuracy: float | None
    note: str = ""
    share: float | None = None  #: mean replicas in a committed step over N (samples carried)

    @property
    def samples_rate(self) -> float | None:
        """Steps/s times the share of replicas in them: samples per second, relative."""
        return None if self.steps_per_s is None or self.share is None \
            else self.steps_per_s * self.share


def torchft_run(steps: int, kills: list[int], h: int, heartbeat_ms: int, folder: Path,
                seed: int) -> Figures:
    from _torchft_run import run

    s = TorchftSettings(replicas=base.REPLICAS, steps=steps, kills=kills,
                        heartbeat_ms=heartbeat_ms, pg_timeout=TIMEOUT, seed=seed,
                        script="_torchft_diloco_replica.py",
                        extra={"sync_every": h, "outer_lr": OUTER_LR,
                               "outer_momentum": OUTER_MOMENTUM})
    try:
        recs = run(s, folder)
        m = base.torchft_measure(recs, steps, kills)
    except RuntimeError as e:
        return Figures(None, None, base._why(str(e)))
    # Each committed outer step carries H steps of the replicas in it (once per step:
    # every replica logs the same commit).
    ns = {r["step"]: r["n"] for r in recs if "step" in r}
    share = statistics.fmean(ns.values()) / base.REPLICAS if ns else None
    return Figures(m.steps_per_s, m.accuracy, m.note, share)


def ours_config(strategy: str, steps: int, kills: list[int], h: int, seed: int) -> RunConfig:
    specs, shift = [], 0
    for k in kills:
        phase = "inner" if strategy == "diloco" else "allreduce:0"
        specs.append(f"rank=1@iter={k + shift},phase={phase}")
        shift += strategy == "rollback"  # the interrupted step is executed twice
    extra: dict[str, Any] = {"sync_every": h} if strategy == "diloco" else {}
    cfg = RunConfig(workload="cnn", paradigm="dp", engine="gloo", ranks=base.REPLICAS,
                    strategy=strategy, elastic="keep-local", stop_at_target=False,
                    max_iterations=steps + shift, eval_every=min(EVAL_EVERY, steps // 3),
                    failures=specs, seed=seed, cost=CostModel(timeout_seconds=TIMEOUT),
                    **extra)
    validate_run(cfg)
    return cfg


def ours_run(strategy: str, steps: int, kills: list[int], h: int, seed: int) -> Figures:
    w = base._Watch()
    s = run_silent(ours_config(strategy, steps, kills, h, seed), w)
    done = int(s.extras["logical_iterations"])
    note = "" if done == steps else f"committed {done} steps, not {steps}"
    share = int(s.updates_applied) / (done * base.REPLICAS) if done else None
    return Figures(base._rate(w.times, done), s.final_metric, note, share)


@dataclass(frozen=True)
class System:
    label: str
    kind: str  # torchft, diloco, rollback


def _one(sy: System, steps: int, kills: list[int], a: argparse.Namespace, tmp: Path,
         seed: int) -> Figures:
    if sy.kind == "torchft":
        return torchft_run(steps, kills, a.sync_every, a.heartbeat_ms,
                           Path(tempfile.mkdtemp(prefix="run-", dir=tmp)), seed)
    return ours_run(sy.kind, steps, kills, a.sync_every, seed)


def _spread(xs: list[float], fmt: str) -> str:
    if not xs:
        return "-"
    return (f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}-"
            f"{fmt.format(max(xs))}]")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500, help="inner steps per run")
    ap.add_argument("--sync-every", type=int, default=10, dest="sync_every",
                    help="H, inner steps per outer step (both DiLoCos)")
    ap.add_argument("--kills", default=None, help="inner steps at which replica 1 is "
                    "killed, comma-separated (default: one, at 1/5 of --steps)")
    ap.add_argument("--kill-every", type=int, default=None, dest="kill_every",
                    help="or a kill every this many steps (from the first multiple)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--heartbeat-ms", type=int, default=1000, dest="heartbeat_ms",
                    help="torchft lighthouse heartbeat timeout")
    ap.add_argument("--no-torchft", action="store_true", help="trainthrough's columns only")
    a = ap.parse_args(argv)
    if a.steps < 3 * base.WINDOW_FROM or a.steps % a.sync_every:
        ap.error("--steps must be at least 30 and a multiple of --sync-every")
    if a.kill_every is not None:
        kills = list(range(a.kill_every, a.steps - a.sync_every, a.kill_every))
    elif a.kills is not None:
        kills = [int(x) for x in a.kills.split(",")]
    else:
        kills = [a.steps // 5]
    if a.replicas < 2 or not kills or not 0 < kills[0] <= kills[-1] < a.steps:
        ap.error("need at least 2 replicas and kills between 1 and --steps - 1")
    base.REPLICAS = a.replicas  # what torchft_measure counts as "all replicas"
    systems = [] if a.no_torchft else [System("torchft 0.2.0 DiLoCo", "torchft")]
    systems += [System("trainthrough gloo diloco", "diloco"),
                System("trainthrough gloo rollback", "rollback")]
    if not a.no_torchft:
        try:
            import torchft  # noqa: F401
        except ImportError:
            sys.exit("vs_torchft_diloco: torchft is not installed (or pass --no-torchft)")
    print(f"{a.replicas} replicas, cnn on digits, Adam 1e-3 (inner), 32 per replica, "
          f"{a.steps} inner steps, H={a.sync_every}, outer SGD Nesterov lr {OUTER_LR} "
          f"momentum {OUTER_MOMENTUM}; replica 1 killed at steps {', '.join(map(str, kills))} "
          f"and restarted; gloo timeout {TIMEOUT:g} s; torchft heartbeat timeout "
          f"{a.heartbeat_ms} ms; {a.repeats} repeats, interleaved", flush=True)
    t0 = time.time()
    runs: dict[tuple[str, bool], list[Figures]] = {}
    with tempfile.TemporaryDirectory(prefix="vs-diloco-") as d:
        tmp = Path(d)
        for rep in range(a.repeats):
            order = systems if rep % 2 == 0 else systems[::-1]
            for sy in order:
                for hit in (False, True):
                    f = _one(sy, a.steps, kills if hit else [], a, tmp, seed=rep)
                    runs.setdefault((sy.label, hit), []).append(f)
                    print(f"[{rep}] {sy.label:<30} {'kills' if hit else 'free ':<6} "
                          f"{f.steps_per_s or 0:7.1f} steps/s, {f.share or 0:.1%} of the "
                          f"replicas, acc {f.accuracy or 0:.4f}"
                          + (f"  ({f.note})" if f.note else ""), flush=True)
    print(f"\n{'system':<30}{'free steps/s':>22}{'steps/s w/ kills':>22}{'by all N':>20}"
          f"{'goodput':>20}{'accuracy free':>24}{'accuracy w/ kills':>24}")
    med: dict[str, dict[str, float]] = {}
    for sy in systems:
        free, hit = runs.get((sy.label, False), []), runs.get((sy.label, True), [])
        fs = [f.steps_per_s for f in free if f.steps_per_s]
        hs = [f.steps_per_s for f in hit if f.steps_per_s]
        good = [h / f for h, f in zip((x.samples_rate for x in hit),
                                      (x.samples_rate for x in free)) if h and f]
        shares = [f.share for f in hit if f.share is not None]
        fa = [f.accuracy for f in free if f.accuracy is not None]
        ha = [f.accuracy for f in hit if f.accuracy is not None]
        med[sy.label] = {k: statistics.median(v) for k, v in
                         (("free", fs), ("hit", hs), ("good", good), ("fa", fa), ("ha", ha)) if v}
        print(f"{sy.label:<30}{_spread(fs, '{:.1f}'):>22}{_spread(hs, '{:.1f}'):>22}"
              f"{_spread(shares, '{:.1%}'):>20}"
              f"{_spread(good, '{:.1%}'):>20}{_spread(fa, '{:.4f}'):>24}"
              f"{_spread(ha, '{:.4f}'):>24}")
        for note in dict.fromkeys(f.note for f in free + hit if f.note):
            print(f"    not measured: {note}")
    if not a.no_torchft:
        t = med.get("torchft 0.2.0 DiLoCo", {})
        for sy in systems[1:]:
            o = med.get(sy.label, {})
            cells = [f"{name} {o[k] / t[k]:.2f}" if k in o and t.get(k) else f"{name} n/a"
                     for k, name in (("free", "free steps/s"), ("hit", "steps/s w/ kills"),
                                     ("good", "goodput"))]
            print(f"  {sy.label.removeprefix('trainthrough ')} / torchft: " + ", ".join(cells))
    for sy in systems:
        o = med.get(sy.label, {})
        if "fa" in o and "ha" in o:
            print(f"  {sy.label}: accuracy with kills - failure-free: "
                  f"{100 * (o['ha'] - o['fa']):+.2f} points")
    print(f"\n{time.time() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
