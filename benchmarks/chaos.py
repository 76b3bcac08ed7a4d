"""Chaos soak: many real faults in one run, on Ray and on gloo, and what must survive.

Each run is the ``trainthrough`` command in a child process, in *this* process's
process group (so a stray group-wide kill would take this script down too), with
a sentinel ``sleep`` alongside it in the same group. On Ray (chain-sync) kills come
from the failure spec language (seeded, MTBF-driven) and land on shards, chain
replicas and workers, including replacements still starting. On gloo (rollback) the
mix of :mod:`chaos_mix` strikes the ranks: crashes, hangs, pauses shorter than every
wait and longer than the collective and liveness timeouts, preemption notices
(``mode=preempt``) and SIGTERMs sent from outside by this script (SIGKILL when the
notice runs out), and slow ranks; the ``gloo-deadline`` run adds a straggler deadline
and ranks slowed far past it. After the run:

- no hang: the command ended within its wall limit plus a margin;
- the target was reached;
- no orphan: no process carrying this run's marker in its environment is left
  (every process the run started, Ray's and gloo's included, inherits it), and none
  was left stopped (a pause or a hang) past the liveness timeout plus a margin;
- no acknowledged update lost while a replica survives (Ray chain-sync:
  ``acknowledged_lost`` is all ``acknowledged_lost_wiped``, what wiped chains took,
  as the run's summary counts them; gloo rollback: no committed update or sample
  lost but in wipes, every rank lost at once, which restart from scratch and are
  counted apart, and the final replicas are bit-identical);
- every checkpoint on disk verifies (checksums, schema);
- the caller's process group survived (this process and the sentinel live);
- no kill reported by Ray as an unexpected death (its "A worker died ... OOM killer"
  paragraph): every kill here is injected, and the run reports it as its own;
- gloo: every fault delivered was answered (drained, fenced, recovered, or went on
  unnoticed): the table by kind (:func:`chaos_mix.tally`).

Usage: ``python benchmarks/chaos.py [--engine ray|gloo|both] [--kills 50]`` (gloo: two
runs, without and with the straggler deadline); the test suite runs a short form
(``tests/test_chaos.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from chaos_mix import (
    GLOO_KINDS,
    STOPPED_MARGIN,
    TIMEOUTS,
    Fault,
    Kind,
    Outside,
    plan,
    table,
    tally,
    wipes,
)

MARK = "TT_CHAOS_RUN"


@dataclass
class Soak:
    """One chaos run: its config, limits, and what it must show."""

    name: str
    config: dict[str, Any]
    kills: int
    wall_limit: float
    checks: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)  #: gloo: the planned mix
    stopped_bound: float | None = None  #: gloo: longest a process may stay stopped


def ray_soak(kills: int, wall: float, target: float = 0.4) -> Soak:
    """chain-sync on Ray: kills spread over heads, tails and workers, the run to reach
    ``target`` (mlr's loss) by its end.

    A quarter more kills are scheduled than required: a tail kill finds no tail at
    position 2 while its chain is still short from an earlier kill, and the seeded
    MTBF draws may run past the window."""
    plan = kills + (kills + 1) // 2
    per = max(1, plan // 3)
    span = wall * 0.6  # kills land in the first 60% of the run, recovery after
    return Soak("ray", {
        "workload": "mlr", "engine": "ray", "consistency": "async",
        "strategy": "base=chain-sync,checkpoint=full", "shards": 2, "workers": 2,
        "replicas": 3, "recovery_delay": 0.2, "checkpoint_every": 50,
        "target": target, "stop_at_target": False, "max_iterations": 10**7,
        "wall_limit": wall, "eval_every": 5, "failures": [
            f"shard=any@mtbf={span / per:.2f}s,max={per}",
            f"shard=any@mtbf={span / per:.2f}s,max={per},replica=2",
            f"worker=any@mtbf={span / (plan - 2 * per):.2f}s,max={plan - 2 * per}"]},
        kills, wall, ["target", "acknowledged"])


def gloo_soak(kills: int, wall: float, deadline: float | None = None,
              seed: int = 0) -> Soak:
    """rollback on gloo ranks, replacements on: ``kills`` faults of the mix
    (:data:`chaos_mix.GLOO_KINDS`) in the first 60% of the run, each answered by a
    drain, a recovery from a peer, or nothing to do. ``deadline``: the straggler
    deadline, and ranks slowed far past it (``slow:1000x``) join the mix."""
    kinds: tuple[Kind, ...] = GLOO_KINDS
    if deadline is not None:
        kinds = (*kinds, Kind("slow-1000x", "slow:1000x", 1))
    faults = plan(kills, 1.5, wall * 0.6 - 1.5, kinds, seed)
    config: dict[str, Any] = {
        "workload": "mlr", "engine": "dist", "paradigm": "dp", "strategy": "rollback",
        "ranks": 3, "replace": True, "recovery_delay": 0.1, "target": 0.4,
        "stop_at_target": False, "max_iterations": 10**7, "wall_limit": wall,
        "eval_every": 20, "liveness_timeout": TIMEOUTS["liveness"],
        "cost": {"timeout_seconds": TIMEOUTS["collective"]},
        "failures": [f.spec() for f in faults if f.spec()]}
    if deadline is not None:
        config["straggler_deadline"] = deadline
    return Soak("gloo" if deadline is None else "gloo-deadline", config, kills, wall,
                ["target", "identical", "answered"], faults,
                TIMEOUTS["liveness"] + STOPPED_MARGIN)


class _Scan:
    """The live processes of one run (its marker's token in their environment), read
    from ``/proc``; each process's environment is read once (by pid and start time)."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._ours: dict[tuple[int, int], bool] = {}

    def _stat(self) -> list[tuple[int, str, int]]:
        """(pid, state, parent pid) of every live process of the run."""
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                text = (d / "stat").read_text(errors="replace")
            except OSError:
                continue
            rest = text[text.rfind(")") + 2:].split()
            if len(rest) < 20 or rest[0] in "ZX":
                continue
            key = (int(d.name), int(rest[19]))
            if key not in self._ours:
                self._ours[key] = _env_token(key[0]) == self.token
            if self._ours[key]:
                out.append((key[0], rest[0], int(rest[1])))
        return out

    def stopped(self) -> list[int]:
        return [pid for pid, state, _ in self._stat() if state in "Tt"]

    def ranks(self) -> list[int]:
        """Rank processes: started as ``rank_main``, or forked by the run's zygote (a
        child of a ``zygote_main`` process, itself one by its command line)."""
        procs = self._stat()
        zyg = {pid for pid, _, _ in procs if b"zygote_main" in _cmdline(pid)}
        return [pid for pid, _, ppid in procs
                if ppid in zyg or b"rank_main" in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _marked() -> list[int]:
    """Pids of live processes whose environment carries this script's run marker."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if f"{MARK}=".encode() in env and int(d.name) != os.getpid():
            out.append(int(d.name))
    return out


def _verify_checkpoints(folder: Path) -> tuple[int, list[str]]:
    """Load every complete checkpoint under ``folder`` (any depth): a folder
    ``<tag>-<step>`` holding a manifest. Returns (how many, the ones that failed)."""
    from trainthrough.errors import CheckpointCorrupt
    from trainthrough.ft.checkpoint import CheckpointStore

    count, bad = 0, []
    for man in sorted(folder.rglob("manifest.json")) if folder.is_dir() else []:
        ck = man.parent
        tag, _, step = ck.name.rpartition("-")
        if not step.isdigit() or ".tmp-" in ck.name:
            continue
        count += 1
        store = CheckpointStore(str(ck.parent))
        infos = [i for i in store.list(tag) if i.name == ck.name]
        try:
            if not infos:
                raise CheckpointCorrupt(f"{ck} is not listed as a complete checkpoint")
            store.load(infos[0])
        except CheckpointCorrupt as e:
            bad.append(f"{ck}: {e}")
    return count, bad


def run_soak(s: Soak, root: Path, quiet: bool = False) -> dict[str, Any]:
    """Run one soak and check every guarantee; returns the figures and the failures."""
    run_dir = root / s.name
    cfg_path = root / f"{s.name}.toml"
    cfg_path.write_text(tomli_w.dumps(s.config))
    token = uuid.uuid4().hex
    env = {**os.environ, MARK: token}
    cmd = [sys.executable, "-m", "trainthrough.cli", "run", "--config", str(cfg_path),
           "--out", str(run_dir), "--quiet"]
    scan = _Scan(token)
    outside = Outside([f.at for f in s.faults if f.spec() is None], scan.ranks,
                      scan.stopped)
    sentinel = subprocess.Popen(["sleep", "3600"])  # same process group as us
    t0 = time.time()
    hung = False
    outside.start()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=s.wall_limit + 120)
        code, err, said = proc.returncode, proc.stderr, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        hung, code = True, None
        err = _text(e.stderr)
        said = _text(e.stdout) + err
    finally:
        outside.stop()
    seconds = time.time() - t0
    time.sleep(2.0)  # let Ray's reaper finish
    orphans = [p for p in _marked() if _env_token(p) == token]
    group_ok = sentinel.poll() is None
    sentinel.kill()
    sentinel.wait()
    summary: dict[str, Any] = {}
    if (run_dir / "summary.json").is_file():
        summary = json.loads((run_dir / "summary.json").read_text())
    ckpts, bad = _verify_checkpoints(run_dir / "checkpoints")
    problems = []
    if hung:
        problems.append("hang: no exit within the wall limit + 120 s")
    elif code not in (0,):
        problems.append(f"exit code {code}: {err.strip().splitlines()[-1:] if err else ''}")
    if not s.faults and summary.get("failures", 0) < s.kills:
        problems.append(f"only {summary.get('failures', 0)} of {s.kills} kills delivered")
    if "target" in s.checks and summary.get("iterations_to_target") is None:
        problems.append("target not reached")
    # A chain that lost every replica before a replacement joined restarts from its
    # checkpoint: acknowledged pushes since then are gone by design (R=3 survives
    # two overlapping failures, not three). The run counts those apart
    # (``acknowledged_lost_wiped``); any other loss is a problem.
    wipeouts = _events(run_dir, "down")
    # In updates (docs/strategies.md); null where the run has no chains to count.
    lost, wiped = summary.get("acknowledged_lost"), summary.get("acknowledged_lost_wiped")
    kept = None if lost is None else lost - (wiped or 0)
    if "acknowledged" in s.checks and kept != 0:
        problems.append(f"acknowledged updates lost with a replica alive: {kept}")
    if "identical" in s.checks and not summary.get("replicas_identical"):
        problems.append("final replicas differ")
    events = _all_events(run_dir)
    # Every rank lost at once restarts from scratch (rollback keeps no checkpoint):
    # those steps are gone by design and counted apart; any other loss is a problem.
    wiped, wipe_lost = wipes(events, s.config.get("ranks", 0))
    lost = {"updates_lost": summary.get("updates_lost", 0) - wipe_lost,
            "samples_dropped": summary.get("samples_dropped")}
    if "identical" in s.checks and any(v != 0 for v in lost.values()):
        problems.append(f"committed work lost under rollback with a rank alive: {lost}")
    rows = tally(events, s.faults, outside.sent) if s.faults else {}
    delivered = sum(r["injected"] for r in rows.values())
    unanswered = sum(r["unanswered"] for r in rows.values())
    if s.faults and delivered < s.kills:
        problems.append(f"only {delivered} of {s.kills} faults delivered "
                        f"({outside.missed} SIGTERMs found no rank)")
    if "answered" in s.checks and unanswered:
        problems.append(f"{unanswered} faults nothing answered: {rows}")
    left_stopped = {p: round(t, 1) for p, t in outside.stopped_longest.items()
                    if s.stopped_bound is not None and t > s.stopped_bound}
    if left_stopped:
        problems.append(f"processes left stopped past {s.stopped_bound} s: {left_stopped}")
    if orphans:
        problems.append(f"orphan processes: {orphans}")
    if bad:
        problems.append(f"checkpoints that do not verify: {bad}")
    if not group_ok:
        problems.append("the caller's process group was hit")
    # Every kill here is injected: Ray must not report one as an unexpected death (its
    # "A worker died ... the OOM killer" paragraph; engines/ray/runtime.py).
    reports = said.count("A worker died")
    if reports:
        problems.append(f"{reports} injected kills reported by Ray as unexpected deaths")
    out = {"soak": s.name, "kills_planned": s.kills, "kills_delivered": summary.get("failures"),
           "recoveries": len(summary.get("recoveries", [])), "seconds": round(seconds, 1),
           "hung": hung, "orphans": len(orphans), "checkpoints_verified": ckpts,
           "checkpoints_bad": len(bad), "target_reached": summary.get("iterations_to_target")
           is not None, "acknowledged_lost": summary.get("acknowledged_lost"),
           "acknowledged_lost_wiped": summary.get("acknowledged_lost_wiped"),
           "acknowledged_lost_pairs": summary.get("acknowledged_lost_pairs"),
           "replicas_identical": summary.get("replicas_identical"),
           "chain_wipeouts": len(wipeouts) if "acknowledged" in s.checks else None,
           "caller_group_survived": group_ok, "death_reports": reports,
           "acknowledged": {k: v for k, v in summary.items() if k.startswith("acknowledged")
                            and not isinstance(v, list)},
           "faults_delivered": delivered if s.faults else None, "kinds": rows,
           "stopped_longest": round(max(outside.stopped_longest.values(), default=0.0), 1),
           "writes_refused": summary.get("writes_refused"),
           "updates_lost": summary.get("updates_lost"),
           "wipes": wiped if s.faults else None,
           "updates_lost_in_wipes": wipe_lost if s.faults else None,
           "outside": [{"pid": x.pid, "at": round(x.at, 2), "ended": x.ended}
                       for x in outside.sent],
           "ranks_drained": summary.get("ranks_drained"), "problems": problems}
    if not quiet:
        print(json.dumps(out))
    return out


def _text(output: str | bytes | None) -> str:
    """What a timed-out child wrote so far (bytes, even with ``text=True``, or None)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _all_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in _all_events(run_dir) if e.get("type") == kind]


def _env_token(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(f"{MARK}=".encode()):
            return item.split(b"=", 1)[1].decode()
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["ray", "gloo", "both"], default="both")
    ap.add_argument("--kills", type=int, default=50, help="faults per run (at least 3)")
    ap.add_argument("--seed", type=int, default=0, help="gloo: the seed of the fault mix")
    ap.add_argument("--seconds", type=float, default=150.0, help="wall limit per run")
    ap.add_argument("--keep", type=Path, help="keep the run folders here (default: a temp dir)")
    args = ap.parse_args()
    if args.kills < 3 or args.seconds <= 0:
        print("chaos: --kills must be at least 3 and --seconds positive", file=sys.stderr)
        return 2
    soaks = []
    if args.engine in ("ray", "both"):
        soaks.append(ray_soak(args.kills, args.seconds))
    if args.engine in ("gloo", "both"):
        soaks.append(gloo_soak(args.kills, args.seconds, seed=args.seed))
        soaks.append(gloo_soak(args.kills, args.seconds, deadline=1.0, seed=args.seed))
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        results = [run_soak(s, args.keep) for s in soaks]
    else:
        with tempfile.TemporaryDirectory(prefix="tt-chaos-") as tmp:
            results = [run_soak(s, Path(tmp)) for s in soaks]
    for r in results:
        if r["kinds"]:
            print(f"\n{r['soak']}: faults by kind\n{table(r['kinds'])}")
    failed = [r for r in results if r["problems"]]
    print(f"\n{len(results) - len(failed)}/{len(results)} soaks clean")
    for r in failed:
        print(f"{r['soak']}: " + "; ".join(r["problems"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
