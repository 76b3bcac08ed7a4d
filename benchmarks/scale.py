"""Real-size models through every recovery, next to plain DDP: issue 31's table.

    python benchmarks/scale.py --quick                 # 10M only, a few minutes
    python benchmarks/scale.py                         # 10M, 50M and 124M (hours on 2 cores)
    python benchmarks/scale.py --sizes 50M --repeats 1 --json runs/scale/50m.json
    python benchmarks/scale.py --workload examples/my_model.py:build   # a TorchWorkload
    python benchmarks/scale.py --device cuda --quick   # both ranks on the machine's GPU

The model (benchmarks/_scale_gpt.py): GPT-2-shaped (causal self-attention, learned
positions, tied embeddings, GPT-2's 50,257-token vocabulary) at 10M (6 layers, 160 wide,
5 heads), 50M (8, 512, 8) and 124M parameters (GPT-2 small: 12, 768, 12), AdamW with
weight-decay groups and gradient clipping, on synthetic tokens (Zipf-distributed, half
of them chained; no network). Trained on 2 ranks over gloo:

- ours: through ``trainthrough.loop`` (``launch()`` with its defaults, the user's own
  loop), or with ``--workload file.py:build`` a ``TorchWorkload`` as
  ``trainthrough run --paradigm dp`` runs it;
- plain ``torch.nn.parallel.DistributedDataParallel`` in its own processes (gloo):
  the same model, initial weights, optimizer, per-rank batch and step count.

Per size, in order: ``--repeats`` failure-free rounds of ours and plain DDP,
interleaved (the order turns every round: A B, B A, ...); then one SIGKILL of rank 0
in the middle of its first allreduce (``rank=0@iter=K,phase=allreduce:0``, K = 2/5 of
the steps) under rollback, lossy-forward and checkpoint-restart (a checkpoint every
steps/6), each with the run's defaults (no ``--timeout``); then a plain
``dist.broadcast`` of the joiner's state bytes between two fresh gloo processes and a
plain crash-safe write (temp file, fsync, rename, folder fsync) of the checkpoint's
bytes beside the run's checkpoints, each 3 times. Rank 0 is the victim so that its
replacement, the lowest slot, is the first member after the join: the
``transfer_seconds`` it reports (docs/events.md, ``rank-joined``) are then the
joiner's, from the share's first collective to the state received and loaded.

Figures: steps/s from step 3 to the end as each rank's loop timed it (a workload:
between its evaluations); peak RSS per rank from the engine's ``peak_rss_bytes`` and
each DDP rank's ``getrusage`` (the largest rank); the stall from ``events.jsonl``
(``failure`` to the next ``training-resumed``); the transfer from ``rank-joined``
(``bytes``, ``transfer_seconds``); the checkpoint's write from the ``checkpoint``
records (``bytes``, ``blocked_seconds``: the copy and the write, median over saves);
the restart from ``summary.json``'s ``restart_seconds``. Each line has its target and
PASS or MISS (info: no target there); exit 1 when one is missed, 2 on bad arguments.

A run that crashes, loses a rank nobody killed (a detection beyond the planned kill)
or passes ``--max-wall`` is stopped (SIGTERM to the run, then SIGKILL to what is left
of its processes, by pid) and its lines are MISS with the rank's error. Progress goes
to stderr; tables to stdout; every figure to ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _scale_gpt import SHAPES, WARM, Settings, parameters  # noqa: E402
from _scale_table import (  # noqa: E402
    STRATEGIES,
    Run,
    final_loss,
    free_rate,
    kill_figures,
    missed,
    peak_rss,
    render,
    rows,
    unplanned,
)

PROGRAM = str(HERE / "_scale_gpt.py")
QUICK = {"sizes": "10M", "block": 64, "batch": 2, "steps": 20, "repeats": 2, "max_wall": 300}
DEFAULTS = {"sizes": ",".join(SHAPES), "block": 256, "batch": 4, "steps": 30, "repeats": 3,
            "max_wall": 1800}
PLAIN_REPEATS = 3
T0 = time.time()


def say(msg: str) -> None:
    print(f"[{time.time() - T0:6.0f} s] {msg}", file=sys.stderr, flush=True)


# -- running things, bounded ------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (a run started in a session of its own)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                # The fields after the command's closing parenthesis: state ppid pgrp session
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[3]) == sid:
                    pids.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return pids


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each (a run ends as ``interrupted``), then SIGKILL to whatever of its
    session is left after a grace period: only processes this benchmark started."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.time() + 20
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.time()))
    for p in procs:
        for pid in _session_pids(p.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if p.poll() is None:
            p.wait()


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as f:
        return subprocess.Popen([sys.executable, PROGRAM, *args], env=env, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _why(log: Path) -> str:
    """The rank's error in one line, from a run's output."""
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    for key in ("Invalid payload size", "Error", "error", "Exception"):
        hits = [x for x in lines if key in x]
        if hits:
            return hits[-1][:300]
    return lines[-1][:300] if lines else "no output"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return out


def ours(s: Settings, max_wall: float) -> Run:
    """One trainthrough run (a subprocess of its own); stopped when it crashes, loses
    a rank nobody killed, or passes ``max_wall``."""
    folder = Path(s.out)
    folder.parent.mkdir(parents=True, exist_ok=True)
    log, result = folder.with_suffix(".log"), folder.with_suffix(".json")
    for f in (log, result):
        f.unlink(missing_ok=True)
    planned = 1 if s.fail else 0
    t0 = time.time()
    p = _start(["workload" if s.workload else "launch", str(result)], s.env(), log)
    error, beat = "", t0
    while p.poll() is None:
        time.sleep(0.5)
        events = _jsonl(folder / "events.jsonl")
        # A rank lost that nobody killed (a crash, and a crash loop after it) ends the
        # run here; a group broken with nobody lost (a collective timeout) goes on, and
        # the table says so.
        lost = [e for e in events if e["type"] == "detection" and e.get("failed")]
        if len(lost) > planned:
            error = (f"{'+'.join(lost[planned]['failed'])} lost at step {lost[planned]['iteration']}"
                     f" and nobody killed it: {_why(log)}")
        elif time.time() - t0 > max_wall:
            error = f"stopped at --max-wall {max_wall:g} s"
        if error:
            _stop([p])
            break
        if time.time() - beat > 60:
            beat = time.time()
            say(f"  ... {beat - t0:.0f} s, {len(events)} events so far")
    wall = time.time() - t0
    if not error and (p.returncode != 0 or not result.exists()):
        error = f"exit code {p.returncode}: {_why(log)}"
    if error:
        return Run(False, error, wall, events=_jsonl(folder / "events.jsonl"))
    data = json.loads(result.read_text())
    return Run(True, "", wall, data["summary"], data.get("returned") or {},
               _jsonl(folder / "events.jsonl"), _jsonl(folder / "metrics.jsonl"))


def _pair(args: list[list[str]], env: dict[str, str], log: Path, outs: list[Path],
          max_wall: float) -> tuple[list[dict[str, Any]], str]:
    """Start two rank processes; their JSON results, or an error."""
    for o in outs:
        o.unlink(missing_ok=True)
    procs = [_start(a, env, log) for a in args]
    t0 = time.time()
    while any(p.poll() is None for p in procs):
        time.sleep(0.5)
        if time.time() - t0 > max_wall or any(p.poll() not in (None, 0) for p in procs):
            _stop(procs)
            break
    codes = [p.returncode for p in procs]
    if any(codes) or not all(o.exists() for o in outs):
        return [], f"exit codes {codes}: {_why(log)}"
    return [json.loads(o.read_text()) for o in outs], ""


def _unclean(r: Run, steps: int) -> str:
    """Why a failure-free run that ended is not one ('' if it is)."""
    x = r.summary
    if x.get("failures") or x.get("logical_iterations") != steps or not x.get("replicas_identical"):
        return (f"{x.get('failures')} failures, {x.get('logical_iterations')} of {steps} steps, "
                f"replicas identical: {x.get('replicas_identical')}")
    broke = unplanned(r.events, 0)
    return f"not failure-free: {broke}" if broke else ""


def ddp(s: Settings, folder: Path, max_wall: float) -> dict[str, Any]:
    """Plain DDP, 2 processes; rank 0's steps/s and the largest peak RSS."""
    folder.mkdir(parents=True, exist_ok=True)
    port, log = _free_port(), folder / "ddp.log"
    outs = [folder / f"ddp-rank{r}.json" for r in range(s.ranks)]
    got, error = _pair([["ddp", str(r), str(s.ranks), str(port), str(outs[r])]
                        for r in range(s.ranks)], s.env(), log, outs, max_wall)
    if error:
        return {"error": error}
    return {"steps_per_s": got[0]["steps_per_s"], "peak_rss": max(g["peak_rss"] for g in got),
            "peak_rss_ranks": [g["peak_rss"] for g in got]}


def plain_broadcast(s: Settings, nbytes: int, folder: Path, max_wall: float) -> dict[str, Any]:
    """A plain ``dist.broadcast`` of ``nbytes`` between two gloo processes: the median
    of the slower rank's seconds."""
    port, log = _free_port(), folder / "bcast.log"
    outs = [folder / f"bcast-rank{r}.json" for r in range(2)]
    got, error = _pair([["bcast", str(r), str(port), str(nbytes), str(PLAIN_REPEATS),
                         str(outs[r])] for r in range(2)], s.env(), log, outs, max_wall)
    if error or not got[1]["received"]:
        return {"bytes": nbytes, "seconds": None, "error": error or "wrong bytes received"}
    return {"bytes": nbytes, "seconds": statistics.median(max(a, b) for a, b in
                                                          zip(got[0]["seconds"], got[1]["seconds"]))}


def plain_write(nbytes: int, folder: Path) -> dict[str, Any]:
    """A crash-safe plain write of ``nbytes`` in ``folder`` (a temp file, written from
    memory in 64 MiB pieces, fsynced, renamed, the folder fsynced): median of 3."""
    from trainthrough.ft.checkpoint.durable import fsync_path

    piece = os.urandom(min(nbytes, 64 * 2**20))
    took = []
    for _ in range(PLAIN_REPEATS):
        final = folder / f"plain-{uuid.uuid4().hex}"
        tmp = final.with_suffix(".tmp")
        t = time.perf_counter()
        with tmp.open("wb") as f:
            left = nbytes
            while left > 0:
                f.write(piece[:left])
                left -= len(piece)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
        fsync_path(str(folder))
        took.append(time.perf_counter() - t)
        final.unlink()
    return {"bytes": nbytes, "seconds": statistics.median(took)}


# -- one size ---------------------------------------------------------------------------
def executed(strategy: str, steps: int, kill: int, every: int) -> int:
    """The executed steps that end a workload's run (``max_iterations`` counts them) at
    ``steps`` committed ones after the kill at attempt ``kill``: the interrupted step
    counts once more under rollback, and checkpoint-restart redoes the steps since the
    save it restores (saves follow the commits every ``every`` steps)."""
    if strategy == "rollback":
        return steps + 1
    if strategy == "checkpoint-restart":
        return steps + 1 + kill - kill // every * every
    return steps


def measure(s: Settings, out: Path, repeats: int, max_wall: float,
            label: str) -> dict[str, Any]:
    """Every run of one size; its figures (what :func:`_scale_table.rows` takes)."""
    kill = s.steps * 2 // 5
    every = max(1, s.steps // 6)
    fig: dict[str, Any] = {"settings": asdict(s), "kill_at": kill, "checkpoint_every": every,
                           "ours": [], "ddp": [], "kills": {}, "bcast": None, "disk": None}
    if not s.workload:
        fig["parameters"] = parameters(s)
    total, n = 2 * repeats + len(STRATEGIES), 0
    for i in range(repeats):
        for kind in (("ours", "ddp") if i % 2 == 0 else ("ddp", "ours")):
            n += 1
            say(f"{label}: {kind} failure-free, round {i + 1} ({n}/{total}) ...")
            if kind == "ours":
                r = ours(replace(s, out=str(out / f"free-{i}")), max_wall)
                got = {"steps_per_s": free_rate(r, WARM), "peak_rss": peak_rss(r),
                       "loss": final_loss(r), "error": r.error or _unclean(r, s.steps),
                       "wall": r.wall}
            else:
                got = ddp(s, out / f"ddp-{i}", max_wall)
            fig[kind].append(got)
            say(f"  {kind}: " + (f"crashed: {got['error']}" if got.get("error") else
                                  f"{got.get('steps_per_s') or float('nan'):.3f} steps/s, peak RSS "
                                  f"{(got.get('peak_rss') or 0) / 2**20:.0f} MiB"))
    for strategy in STRATEGIES:
        n += 1
        say(f"{label}: SIGKILL of rank 0 at step {kill}, {strategy} ({n}/{total}) ...")
        r = ours(replace(s, out=str(out / strategy), strategy=strategy,
                         fail=f"rank=0@iter={kill},phase=allreduce:0",
                         checkpoint_every=every if strategy == "checkpoint-restart" else None,
                         executed=executed(strategy, s.steps, kill, every) if s.workload else 0),
                 max_wall)
        k = fig["kills"][strategy] = kill_figures(r, strategy, s.steps)
        log = (out / strategy).with_suffix(".log")
        if r.ok and k["problems"] and log.exists() and "Error" in log.read_text(errors="replace"):
            k["problems"].append(f"rank output: {_why(log)}")  # it ended, yet something broke
        say(f"  {strategy}: " + ("; ".join(k["problems"]) or
                                 f"stall {k.get('stall') or float('nan'):.2f} s, "
                                 f"final loss {k.get('loss')}"))
    joined = [k["join"]["bytes"] for k in fig["kills"].values() if k.get("join", {}).get("bytes")]
    if joined:
        say(f"{label}: plain broadcast of {joined[0] / 2**20:.0f} MiB ...")
        fig["bcast"] = plain_broadcast(s, joined[0], out, max_wall)
    ckpt = fig["kills"].get("checkpoint-restart", {}).get("checkpoint")
    if ckpt:
        say(f"{label}: plain crash-safe write of {ckpt['bytes'] / 2**20:.0f} MiB ...")
        where = out / "checkpoint-restart" / "checkpoints"
        fig["disk"] = plain_write(ckpt["bytes"], where if where.is_dir() else out)
    return fig


# -- the command ------------------------------------------------------------------------
def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help=f"10M only, block 64, batch 2, 20 steps, 2 rounds ({QUICK})")
    p.add_argument("--sizes", help=f"comma-separated, of {', '.join(SHAPES)} (default: all)")
    p.add_argument("--repeats", type=int, help="failure-free rounds of each (default 3)")
    p.add_argument("--steps", type=int, help="steps a run (default 30; at least 10)")
    p.add_argument("--block", type=int, help="sequence length (default 256)")
    p.add_argument("--batch", type=int, help="sequences per rank per step (default 4)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--workload", help="a TorchWorkload by reference (file.py:build) "
                                      "instead of the GPT; not with --sizes/--block/--batch")
    p.add_argument("--max-wall", type=float, dest="max_wall",
                   help="seconds a run may take before it is stopped as a MISS "
                        "(default 1800; --quick 300)")
    p.add_argument("--out", default="runs/scale", help="run folders (default runs/scale)")
    p.add_argument("--json", default=None, help="results file (default OUT/results.json)")
    a = p.parse_args(argv)

    def refuse(msg: str) -> None:
        print(f"scale: {msg}", file=sys.stderr)
        raise SystemExit(2)

    base = QUICK if a.quick else DEFAULTS
    if a.workload and (a.sizes or a.block or a.batch):
        refuse("--workload trains the workload's own model and batch: drop --sizes, "
                "--block and --batch")
    if a.workload and a.device == "cuda":
        refuse("--workload runs a TorchWorkload, which trains on the CPU (the engine's own "
               "workloads do): --device cuda applies to the GPT's loop only")
    for k, v in base.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    sizes = [x for x in a.sizes.split(",") if x]
    bad = [x for x in sizes if x not in SHAPES]
    if bad:
        refuse(f"unknown size {bad[0]!r}: use {', '.join(SHAPES)}")
    if a.steps < 10 or a.repeats < 1 or a.block < 1 or a.batch < 1 or a.max_wall <= 0:
        refuse("--steps at least 10; --repeats, --block, --batch and --max-wall positive")
    a.sizes = sizes if not a.workload else ["workload"]
    return a


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("scale: --device cuda, but torch.cuda.is_available() is False here; "
                  "use --device cpu", file=sys.stderr)
            return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"argv": sys.argv[1:], "device": a.device,
                               "cores": os.cpu_count(), "sizes": {}}
    if a.device == "cpu":  # ours and plain DDP alike on the CPU, even where a GPU is
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    failed = False
    for size in a.sizes:
        s = Settings(size="10M" if a.workload else size, block=a.block, batch=a.batch,
                     steps=a.steps, device=a.device, workload=a.workload or "")
        label = a.workload if a.workload else f"{size} ({parameters(s) / 1e6:.1f}M parameters)"
        shape = "" if a.workload else f", block {a.block}, batch {a.batch} per rank"
        say(f"== {label}: {a.steps} steps{shape}, 2 ranks, {a.device}")
        fig = measure(s, out / size, a.repeats, a.max_wall, size)
        table = rows(size, fig)
        results["sizes"][size] = {"figures": fig, "rows": [asdict(r) for r in table]}
        print(render(f"{label}, {a.device}, 2 ranks, {a.repeats} rounds", table), flush=True)
        print(flush=True)
        failed = failed or bool(missed(table))
    results["passed"] = not failed
    path = Path(a.json) if a.json else out / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"{time.time() - T0:.0f} s in all; figures in {path}, run folders under {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
