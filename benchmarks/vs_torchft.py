"""trainthrough next to torchft: the same training, the same kills, side by side.

The training: trainthrough's ``cnn`` (two convolutions, two dense layers) on the
bundled 8x8 digits, Adam (lr 1e-3), 32 samples per replica per step, ``--steps``
committed steps, data parallel on N replicas over gloo on 127.0.0.1; both load the
digits with ``digits_split`` (the cnn workload's loader), so a restarted process pays
the same. The kills: replica 1 SIGKILLs itself at the allreduce of the steps
``--kills`` (one, at 1/5 of the run, by default), before sending anything
(trainthrough's ``phase=allreduce:0``), and is started again at once; a kill that
falls due while it is still coming back strikes it as soon as it is back (on both).

- torchft 0.2.0, written as its ``train_ddp.py``: one process per replica group, a
  ``Manager`` (``min_replica_size`` 1), ``OptimizerWrapper``, ``ProcessGroupGloo``
  (timeout 5 s, as train_ddp.py on CPU), healing over ``PGTransport``; its
  ``torchft_lighthouse`` started here on 127.0.0.1
  and stopped by PID. The gradients go in one ``manager.allreduce`` a step (what its
  DDP does with this model's single bucket), because torchft's own
  ``DistributedDataParallel`` crashes the *survivor* when a peer dies at the
  allreduce (``assert fut._fut`` in its comm hook after the gloo error); ``--ddp``
  runs it that way and prints the crash. Measured at a lighthouse heartbeat timeout
  of ``--heartbeat-ms`` (1 s) and at its default (5 s): with 2 replicas a survivor
  gets no quorum until the dead one's heartbeat expires (more than half of the
  heartbeating replicas must join), so that timeout is torchft's stall.
- trainthrough's gloo engine through ``run_silent(RunConfig(workload="cnn",
  paradigm="dp", engine="gloo", ...))``, ``--strategy rollback`` and
  ``lossy-forward``, ``elastic=keep-local`` (32 per replica whatever the group's
  size, as torchft), collective timeout 5 s, the replacement started at once; one
  allreduce a step, which carries the commit vote (dp/step.py), and one gradient
  call a rank. ``--ray`` adds the same on trainthrough's Ray engine (ranks as Ray
  actors, on a local Ray started here).

The same steps on both: repetition k runs seed k on every system, and torchft's
replicas start from our workload's initial parameters (``init_sync=False``, torchft's
setting for identically initialized replicas) and train at committed step k on their
share of our k-th global batch (``dp/batching``). Without failures both systems then
end at the same accuracy (measured: 0.9666 on both at 800 steps, seed 0), so a
difference with kills comes from recovery: which samples a failed step loses, how many
steps the survivor trains alone, and keep-local's learning rate (scaled by the
group's share, the linear scaling rule; torchft keeps it).

N = 2 replicas by default (``--replicas``): each replica trains on one thread, and on
a 2-core machine a third busy process (trainthrough's controller, torchft's
lighthouse) already shares them; more replicas there measure the scheduler as much as
the systems. ``--rank-start exec,fork`` puts trainthrough's gloo ranks started cold
(``python -m``, torch imported by each) next to ranks forked warm (the default), on
the same kills: what the degraded window while a replacement starts costs in accuracy.
``--no-torchft`` runs trainthrough's columns only.

1,500 steps and one kill at step 300 by default, about 5 minutes with 3 repeats.
One kill, far from the end, because torchft's survivor alone runs ~200 steps/s here
while a restarted process takes 3-5 s to come back (more while the machine is
busy): at 300 steps with kills at 100 and 200, and still at 1,500 with kills at 300
and 900, the next kill (or the end) came before its rejoin, so most rejoin times
were not measurable. ``--kills 300,900`` gives two kills a run.

Reported per system, the median [min-max] over ``--repeats`` runs, interleaved (the
order alternates every repetition), after one short warm-up run of each:
- free steps/s: committed steps 10 to the first kill over their wall time;
- steps/s with kills: steps 10 to the last, kills and recoveries included (a step
  committed by fewer replicas carries fewer samples: 32 each), and the share of
  steps committed by all N;
- stall per kill: kill -> the next committed step (any replica);
- rejoin: kill -> back to N replicas (torchft: the first step committed by N;
  trainthrough: the group re-formed with the replacement, which commits its next
  step with N), if before the next kill or the end;
- accuracy on the held-out digits at the end (replica 0, never killed);
then each as trainthrough / torchft, with torchft's heartbeat timeout named.

    python benchmarks/vs_torchft.py [--steps 1500] [--kills 300] [--repeats 3]
                                    [--heartbeat-ms 1000] [--no-default-heartbeat]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _torchft_run import TorchftSettings  # noqa: E402
from trainthrough.config import CostModel, RunConfig  # noqa: E402
from trainthrough.engines.callbacks import Callback  # noqa: E402
from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray  # noqa: E402
from trainthrough.lab.runner import run_silent  # noqa: E402
from trainthrough.lab.validate import validate_run  # noqa: E402

REPLICAS = 2
WINDOW_FROM = 10  # steps/s from this committed step (all N in), so start-up is left out
# trainthrough's evaluations give the benchmark its step times; each one scores the
# held-out digits on the first rank, inside its step (before 2026-11-27 the parameters
# went to the controller, which scored them on a core the ranks need). torchft's
# replicas evaluate only at the end, so ours evaluate every 50 steps,
# not every 10 (measured, one 3-repetition run each: 205-213 free steps/s with
# evaluations every 10 steps, 220-277 with every 50). A run shorter than 150 steps
# evaluates every third of it: the rate needs two evaluations after WINDOW_FROM.
EVAL_EVERY = 50
TIMEOUT = 5.0  # torchft's ProcessGroupGloo timeout and trainthrough's collective timeout
DEFAULT_HEARTBEAT_MS = 5000  # torchft_lighthouse --heartbeat_timeout_ms default


@dataclass
class Measured:
    """One run's figures (None: not measurable in that run; ``note`` says why)."""

    free_steps_per_s: float | None  #: before the first kill (the whole window without)
    steps_per_s: float | None  #: the whole window, kills and recoveries included
    accuracy: float | None
    stalls: list[float] = field(default_factory=list)
    rejoins: list[float | None] = field(default_factory=list)  #: None: not back in time
    #: share of the committed steps taken by all N replicas (a step by fewer is cheaper:
    #: 32 samples per replica, so it carries fewer samples)
    full: float | None = None
    note: str = ""


def _rate(times: dict[int, float], last: int) -> float | None:
    """Committed steps per second from the first step >= WINDOW_FROM to the last one
    <= ``last`` (``times``: committed step -> wall time)."""
    inside = [s for s in times if WINDOW_FROM <= s <= last]
    if len(inside) < 2 or times[max(inside)] <= times[min(inside)]:
        return None
    return (max(inside) - min(inside)) / (times[max(inside)] - times[min(inside)])


def _rejoins(kills: list[float], back: list[float], end: float) -> list[float | None]:
    """Kill -> back to N replicas, if before the next kill (or the end of the run)."""
    bounds = [*kills[1:], end]
    return [min((t - k for t in back if k < t <= b), default=None) for k, b in zip(kills, bounds)]


# -- torchft --------------------------------------------------------------------------
def torchft_measure(recs: list[dict[str, Any]], steps: int, kills: list[int]) -> Measured:
    """Figures from the replicas' logs. The run ends at the first ``final`` record: a
    replica still coming back then is not waited for (nor is trainthrough's)."""
    ends = [r["t"] for r in recs if r.get("final", -1) >= steps]
    if not ends:
        return Measured(None, None, None, note="no replica reached the last step")
    t_end = min(ends)
    commits = [r for r in recs if "step" in r and r["t"] <= t_end]
    times: dict[int, float] = {}  # step -> its first commit, from the first one with all N
    first_full = min((r["step"] for r in commits if r["n"] == REPLICAS), default=steps + 1)
    for r in commits:
        if r["step"] >= first_full:
            times[r["step"]] = min(times.get(r["step"], r["t"]), r["t"])
    hit = sorted(r["t"] for r in recs if "kill" in r and r["t"] <= t_end)
    stalls = [min((r["t"] for r in commits if r["t"] > k), default=t_end) - k for k in hit]
    back = [r["t"] for r in commits if r["n"] == REPLICAS]
    acc = [r["accuracy"] for r in recs if r.get("final", -1) >= steps and r["replica"] == 0]
    by_all = {r["step"] for r in commits if r["n"] == REPLICAS}
    return Measured(_rate(times, kills[0] if kills else steps), _rate(times, steps),
                    acc[0] if acc else None, stalls, _rejoins(hit, back, t_end),
                    full=len(by_all) / steps)


def run_torchft(steps: int, kills: list[int], heartbeat_ms: int, folder: Path,
                ddp: bool = False, seed: int = 0) -> Measured:
    from _torchft_run import run

    s = TorchftSettings(replicas=REPLICAS, steps=steps, kills=kills,
                        heartbeat_ms=heartbeat_ms, pg_timeout=TIMEOUT, ddp=ddp, seed=seed)
    try:
        return torchft_measure(run(s, folder), steps, kills)
    except RuntimeError as e:
        return Measured(None, None, None, note=_why(str(e)))


def _why(error: str) -> str:
    """A replica's crash in one line: what exited, the innermost frame, the exception."""
    lines = [x.strip() for x in error.strip().splitlines() if x.strip()]
    frame = max((i for i, x in enumerate(lines) if x.startswith("File ")), default=None)
    inner = [] if frame is None else lines[frame:frame + 2]
    return "; ".join(dict.fromkeys([lines[0].rstrip(":"), *inner, lines[-1]]))[:300]


# -- trainthrough ---------------------------------------------------------------------
class _Watch(Callback):
    """Wall times of evaluations (by committed step), failures and rejoins."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}
        self.failures: list[float] = []
        self.joins: list[float] = []

    def after_eval(self, record: dict[str, Any]) -> None:
        s, t = int(record.get("logical_iteration", -1)), float(record["wall_seconds"])
        self.times[s] = min(self.times.get(s, t), t)

    def on_event(self, event: dict[str, Any]) -> None:
        if event["type"] == "failure":
            self.failures.append(float(event["wall_seconds"]))
        elif event["type"] == "rank-joined":
            self.joins.append(float(event["wall_seconds"]))


def trainthrough_config(strategy: str, steps: int, kills: list[int],
                        engine: str = "gloo", seed: int = 0) -> RunConfig:
    """Kills at committed steps ``kills``: ``@iter=`` counts executed attempts, and
    rollback executes the interrupted step twice, so later triggers shift by one."""
    specs, shift = [], 0
    for k in kills:
        specs.append(f"rank=1@iter={k + shift},phase=allreduce:0")
        shift += strategy == "rollback"
    cfg = RunConfig(workload="cnn", paradigm="dp", engine=engine, ranks=REPLICAS,
                    strategy=strategy, elastic="keep-local", stop_at_target=False,
                    max_iterations=steps + shift, eval_every=min(EVAL_EVERY, steps // 3), failures=specs, seed=seed,
                    cost=CostModel(timeout_seconds=TIMEOUT))
    validate_run(cfg)
    return cfg


def run_trainthrough(strategy: str, steps: int, kills: list[int],
                     engine: str = "gloo", seed: int = 0, rank_start: str = "fork") -> Measured:
    """``rank_start``: how local gloo ranks start (``TRAINTHROUGH_RANK_START``)."""
    w = _Watch()
    before = os.environ.get("TRAINTHROUGH_RANK_START")
    os.environ["TRAINTHROUGH_RANK_START"] = rank_start
    try:
        s = run_silent(trainthrough_config(strategy, steps, kills, engine, seed), w)
    finally:
        if before is None:
            os.environ.pop("TRAINTHROUGH_RANK_START")
        else:
            os.environ["TRAINTHROUGH_RANK_START"] = before
    done = int(s.extras["logical_iterations"])
    note = "" if done == steps else f"committed {done} steps, not {steps}"
    stalls = [r.recovery_seconds for r in s.recoveries]
    end = max(w.times.values(), default=0.0)
    # One rank is down at a time: every committed step applied N or N-1 replicas' updates.
    full = (s.updates_applied - (REPLICAS - 1) * done) / done
    return Measured(_rate(w.times, kills[0] if kills else done), _rate(w.times, done),
                    s.final_metric, stalls, _rejoins(w.failures, w.joins, end), full=full,
                    note=note)


# -- the comparison -------------------------------------------------------------------
@dataclass(frozen=True)
class System:
    label: str
    kind: str  # "torchft" or "trainthrough"
    strategy: str = ""
    heartbeat_ms: int = 0
    engine: str = "gloo"  # trainthrough's: gloo processes, or ranks as Ray actors
    rank_start: str = "fork"  # trainthrough gloo's: ranks forked warm, or exec'd cold


def _run(system: System, steps: int, kills: list[int], tmp: Path, ddp: bool,
         seed: int = 0) -> Measured:
    if system.kind == "torchft":
        folder = Path(tempfile.mkdtemp(prefix="run-", dir=tmp))
        return run_torchft(steps, kills, system.heartbeat_ms or DEFAULT_HEARTBEAT_MS,
                           folder, ddp, seed)
    return run_trainthrough(system.strategy, steps, kills, system.engine, seed,
                            system.rank_start)


def _spread(xs: list[float], unit: str, fmt: str = "{:.2f}") -> str:
    if not xs:
        return "-"
    med = fmt.format(statistics.median(xs))
    return f"{med}{unit} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def measure(systems: list[System], steps: int, kills: list[int], repeats: int,
            tmp: Path, ddp: bool = False, warmup: bool = True,
            log: Any = print) -> dict[str, list[Measured]]:
    """Every system ``repeats`` times, interleaved: the order alternates each
    repetition. Returns the runs by system label."""
    if warmup:  # page caches, imports, the first gloo rendezvous: paid before measuring
        for kind in dict.fromkeys((sy.kind, sy.engine) for sy in systems):
            _run(next(sy for sy in systems if (sy.kind, sy.engine) == kind), WINDOW_FROM * 3,
                 [], tmp, ddp)
    out: dict[str, list[Measured]] = {}
    for rep in range(repeats):
        # Repetition k runs seed k on every system: the same initial parameters and
        # sample order side by side, and accuracy's median over several trajectories
        # (one held-out digit is 0.28 points; one trajectory is one draw).
        for sy in systems if rep % 2 == 0 else systems[::-1]:
            m = _run(sy, steps, kills, tmp, ddp, seed=rep)
            out.setdefault(sy.label, []).append(m)
            stalls = " ".join(f"{x:.3f}" for x in m.stalls)
            rejoins = " ".join("-" if x is None else f"{x:.2f}" for x in m.rejoins)
            log(f"[{rep}] {sy.label:<32}{m.free_steps_per_s or 0:7.1f} free, "
                f"{m.steps_per_s or 0:6.1f} steps/s, acc {m.accuracy or 0:.4f}"
                + (f", {m.full or 0:.1%} by all, stalls {stalls} s, rejoins {rejoins} s"
                   if kills else "")
                + (f"  ({m.note})" if m.note else ""), flush=True)
    return out


COLUMNS = {"free": "free steps/s", "hit": "steps/s w/ kills", "full": "steps by all N",
           "stall": "stall/kill (s)", "rejoin": "rejoin (s)", "acc": "accuracy"}


def _columns(ms: list[Measured]) -> dict[str, list[float]]:
    pick = {"free": lambda m: [m.free_steps_per_s], "hit": lambda m: [m.steps_per_s],
            "full": lambda m: [m.full],
            "stall": lambda m: m.stalls, "rejoin": lambda m: m.rejoins,
            "acc": lambda m: [m.accuracy]}
    return {k: [x for m in ms for x in f(m) if x is not None] for k, f in pick.items()}


def report(systems: list[System], runs: dict[str, list[Measured]], kills: list[int]) -> None:
    """The table (median [min-max]), what could not be measured, and the ratios."""
    keys = [k for k in COLUMNS if kills or k in ("free", "acc")]
    print(f"\n{'system':<34}" + "".join(f"{COLUMNS[k]:>24}" for k in keys))
    med: dict[str, dict[str, float]] = {}
    for sy in systems:
        ms = runs.get(sy.label, [])
        cols = _columns(ms)
        med[sy.label] = {k: statistics.median(v) for k, v in cols.items() if v}
        fmt = {"stall": "{:.3f}", "acc": "{:.4f}", "full": "{:.1%}"}
        print(f"{sy.label:<34}" + "".join(f"{_spread(cols[k], '', fmt.get(k, '{:.2f}')):>24}"
                                          for k in keys))
        notes = [m.note for m in ms if m.note]
        lost = sum(m.rejoins.count(None) for m in ms)
        if lost:
            notes.append(f"{lost} of {sum(len(m.rejoins) for m in ms)} kills: not back to "
                         f"{REPLICAS} replicas before the next kill or the end (no rejoin time)")
        for note in dict.fromkeys(notes):
            print(f"    not measured: {note}")
    print("\ntrainthrough / torchft, medians (steps/s, accuracy: higher is better; stall, "
          "rejoin: lower is better)")
    for ours in (s for s in systems if s.kind == "trainthrough"):
        for theirs in (s for s in systems if s.kind == "torchft"):
            a, b = med[ours.label], med[theirs.label]
            cells = [f"{COLUMNS[k]} {a[k] / b[k]:.2f}" if k in a and b.get(k) else
                     f"{COLUMNS[k]} n/a" for k in keys if k != "full"]
            print(f"  {ours.label.removeprefix('trainthrough ')} / {theirs.label}: "
                  + ", ".join(cells))


def _kills(ap: argparse.ArgumentParser, text: str | None, steps: int) -> list[int]:
    if text is None:
        return [steps // 5]
    try:
        kills = [int(x) for x in text.split(",")]
    except ValueError:
        ap.error(f"--kills takes committed steps separated by commas (got {text!r})")
    if kills != sorted(set(kills)) or not WINDOW_FROM < kills[0] <= kills[-1] < steps:
        ap.error(f"--kills must increase, from {WINDOW_FROM + 1} to --steps - 1 (got {text!r})")
    return kills


def main(argv: list[str] | None = None) -> None:
    global REPLICAS  # the replica count every measurement reads (--replicas)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500, help="committed steps per run")
    ap.add_argument("--kills", default=None,
                    help="committed steps at which replica 1 is killed, comma-separated "
                         "(default: one, at 1/5 of --steps)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per system")
    ap.add_argument("--heartbeat-ms", type=int, default=1000,
                    help="torchft lighthouse heartbeat timeout (also run at its default 5000 "
                         "unless --no-default-heartbeat)")
    ap.add_argument("--no-default-heartbeat", action="store_true",
                    help="skip the torchft runs at its default heartbeat timeout")
    ap.add_argument("--no-kills", action="store_true", help="failure-free runs only")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--ray", action="store_true",
                    help="also trainthrough's Ray engine (ranks as Ray actors, a local "
                         "Ray started here)")
    ap.add_argument("--replicas", type=int, default=REPLICAS,
                    help=f"replicas (ranks) on both systems (default {REPLICAS})")
    ap.add_argument("--rank-start", default="fork",
                    help="how trainthrough's gloo ranks start, comma-separated for one "
                         "column each: fork (warm zygote), exec (a fresh python -m)")
    ap.add_argument("--strategies", default="rollback,lossy-forward",
                    help="trainthrough's strategies, comma-separated")
    ap.add_argument("--no-torchft", action="store_true",
                    help="trainthrough's columns only (no torchft install needed)")
    ap.add_argument("--ddp", action="store_true",
                    help="torchft through its DistributedDataParallel (crashes on a kill)")
    a = ap.parse_args(argv)
    if a.steps < 3 * WINDOW_FROM:
        ap.error(f"--steps must be at least {3 * WINDOW_FROM}")
    if a.replicas < 2:
        ap.error("--replicas must be at least 2")
    starts = a.rank_start.split(",")
    if not set(starts) <= {"fork", "exec"}:
        ap.error(f"--rank-start takes fork and exec (got {a.rank_start!r})")
    strategies = a.strategies.split(",")
    if not set(strategies) <= {"rollback", "lossy-forward", "checkpoint-restart"}:
        ap.error(f"--strategies takes rollback, lossy-forward, checkpoint-restart "
                 f"(got {a.strategies!r})")
    REPLICAS = a.replicas
    if not a.no_torchft:
        try:
            import torchft  # noqa: F401
        except ImportError:
            sys.exit("vs_torchft: torchft is not installed: pip install -e '.[bench]' "
                     "(or pass --no-torchft)")
    kills = [] if a.no_kills else _kills(ap, a.kills, a.steps)
    hb = [a.heartbeat_ms] if not kills or a.no_default_heartbeat else \
        sorted({a.heartbeat_ms, DEFAULT_HEARTBEAT_MS})
    systems = [] if a.no_torchft else [
        System(f"torchft (heartbeat {h / 1000:g} s)", "torchft", heartbeat_ms=h) for h in hb]
    engines = ("gloo", "ray") if a.ray else ("gloo",)
    systems += [System(f"trainthrough {en} {st}"
                       + (f" {how}" if len(starts) > 1 and en == "gloo" else ""),
                       "trainthrough", st, engine=en, rank_start=how)
                for en in engines for st in strategies
                for how in (starts if en == "gloo" else starts[:1])]
    print(f"{REPLICAS} replicas (2 cores, one training thread each; a third process, the "
          f"controller or the lighthouse, shares them), cnn on digits, Adam 1e-3, 32 per "
          f"replica, {a.steps} steps; replica 1 SIGKILLed at the allreduce of steps "
          f"{', '.join(map(str, kills)) or 'none'} and restarted; gloo timeout {TIMEOUT:g} s "
          f"on both; torchft lighthouse heartbeat timeout "
          f"{' and '.join(f'{h} ms' for h in hb)} (its default: {DEFAULT_HEARTBEAT_MS} ms); "
          f"{a.repeats} repeats, interleaved; free steps/s: steps {WINDOW_FROM}.."
          f"{kills[0] if kills else a.steps}", flush=True)
    t0 = time.time()
    started = a.ray and ensure_ray()
    try:
        with tempfile.TemporaryDirectory(prefix="vs-torchft-") as d:
            tmp = Path(d)
            runs = measure(systems, a.steps, kills, a.repeats, tmp, a.ddp,
                           warmup=not a.no_warmup)
    finally:
        if started:
            shutdown_ray()
    report(systems, runs, kills)
    print(f"\n{time.time() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
