"""The device check: the byo-loop example's model on one GPU, through failures.

    PYTHONPATH=src python3 benchmarks/gpu_check.py            # on a machine with a GPU
    PYTHONPATH=src python3 benchmarks/gpu_check.py --device cpu --epochs 1   # a dry run

Everything runs on the gloo engine (no Ray) with 2-4 ranks sharing the GPU, so the
collective is gloo with buckets staged through host memory (NCCL cannot put two ranks
of one communicator on one GPU). It needs only PyTorch and the project's own
pure-Python dependencies (safetensors, numpy, fsspec, tomli-w, rich, matplotlib,
scikit-learn, markdown-it-py), and checks, in one table:

- a rank SIGKILLed in the middle of an allreduce (``phase=allreduce:0``), recovered by
  rollback, by lossy-forward and by checkpoint-restart: the failure recorded, the
  recovery the strategy names, replicas identical at the end, the final accuracy within
  2 points of the failure-free run, and (rollback, lossy-forward) a replacement that
  joined with a live peer's state, (checkpoint-restart) the restore from the last save
  before the failure;
- failure-free steps/s against plain ``DistributedDataParallel`` on the same device,
  ranks, model, batch and steps (the floor without fault tolerance), runs interleaved
  and repeated, medians compared: target >= 0.9x;
- checkpoint-async overhead (a save every 50 steps by default, copied to pinned host
  memory on a side stream and written on a background thread) against the same runs
  without checkpoints: target <= 3%.

Exit status: 0 when every check passes, 1 when one fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainthrough.config import CostModel, RunConfig
from trainthrough.engines.result import RunResult
from trainthrough.errors import UserError
from trainthrough.lab import runner

HERE = Path(__file__).resolve().parent
LOOP = f"{HERE / 'gpu_loop.py'}:train"
KILL = "rank=1@iter=30,phase=allreduce:0"  # mid-allreduce, in the first epoch
ACCURACY_POINTS = 2.0
RECOVERY_EPOCHS = 8


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, bool]] = []

    def add(self, check: str, measured: str, target: str, ok: bool) -> None:
        self.rows.append((check, measured, target, ok))
        print(f"  {'ok  ' if ok else 'FAIL'} {check}: {measured}", file=sys.stderr, flush=True)

    def print(self) -> None:
        w = [max(len(r[i]) for r in [("check", "measured", "target", True), *self.rows])
             for i in range(3)]
        print(f"| {'check':<{w[0]}} | {'measured':<{w[1]}} | {'target':<{w[2]}} | pass |")
        print(f"|{'-' * (w[0] + 2)}|{'-' * (w[1] + 2)}|{'-' * (w[2] + 2)}|------|")
        for c, m, t, ok in self.rows:
            print(f"| {c:<{w[0]}} | {m:<{w[1]}} | {t:<{w[2]}} | {'yes' if ok else 'NO':<4} |")

    @property
    def passed(self) -> bool:
        return all(r[3] for r in self.rows)


def ours(a: argparse.Namespace, name: str, strategy: str = "rollback",
         fail: tuple[str, ...] = (), checkpoint_every: int | None = None) -> RunResult:
    """One trainthrough run of the loop; its result (``extras["returned"]``: rank 0's)."""
    cfg = RunConfig(workload=LOOP, paradigm="dp", engine="gloo", ranks=a.ranks,
                    strategy=strategy, failures=list(fail), seed=0, device=a.device,
                    replace=True, recovery_delay=0.2, checkpoint_every=checkpoint_every,
                    cost=CostModel(timeout_seconds=10.0))
    print(f"run {name} ...", file=sys.stderr, flush=True)
    return runner.run(cfg, Path(a.out) / name, overwrite=True).result


def ddp(a: argparse.Namespace, name: str) -> dict[str, Any]:
    """Plain DDP, one process per rank; rank 0's result."""
    print(f"run {name} (plain DDP) ...", file=sys.stderr, flush=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"rank{r}.json" for r in range(a.ranks)]
        procs = [subprocess.Popen([sys.executable, str(HERE / "gpu_loop.py"), str(r),
                                   str(a.ranks), str(port), _rank_device(a, r), str(outs[r])])
                 for r in range(a.ranks)]
        codes = [p.wait(timeout=600) for p in procs]
        if any(codes):
            raise RuntimeError(f"plain DDP ranks exited with {codes}")
        results = [json.loads(o.read_text()) for o in outs]
    if len({r["params"] for r in results}) != 1:
        raise RuntimeError("plain DDP replicas differ at the end")
    return dict(results[0])


def _rank_device(a: argparse.Namespace, rank: int) -> str:
    if a.device == "cpu":
        return "cpu"
    return f"cuda:{rank % torch.cuda.device_count()}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4, help="2 to 4 ranks sharing the GPU")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3, help="interleaved throughput rounds")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: a dry run of the same checks on a machine without a GPU")
    p.add_argument("--checkpoint-every", type=int, default=50, dest="every",
                   help="checkpoint-async: steps between saves (default 50)")
    p.add_argument("--out", default="runs/gpu-check")
    a = p.parse_args(argv)
    if not 2 <= a.ranks <= 4 or min(a.epochs, a.repeats, a.every) < 1:
        print("gpu_check: --ranks 2 to 4; --epochs, --repeats and --checkpoint-every at "
              "least 1", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); "
              "--device cpu runs the same checks on the CPU", file=sys.stderr)
        return 2
    os.environ["TT_GPU_EPOCHS"] = str(a.epochs)
    t_start = time.perf_counter()
    print(f"torch {torch.__version__}, device {a.device}"
          + (f" ({torch.cuda.get_device_name(0)})" if a.device == "cuda" else "")
          + f", {a.ranks} ranks", flush=True)
    table = Table()
    try:
        throughput(a, table)
        recoveries(a, table)
    except UserError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    table.print()
    print(f"{time.perf_counter() - t_start:.0f} s in all; run folders under {a.out}")
    return 0 if table.passed else 1


def throughput(a: argparse.Namespace, table: Table) -> None:
    """Interleaved rounds: ours, plain DDP, ours with checkpoint-async (the order turns
    each round, so drift in the machine's speed falls on every column alike)."""
    runs: dict[str, Callable[[int], dict[str, Any]]] = {
        "ours": lambda i: ours(a, f"plain-{i}").extras["returned"],
        "ddp": lambda i: ddp(a, f"ddp-{i}"),
        "async": lambda i: _with_blocked(ours(a, f"ckpt-async-{i}",
                                              "base=checkpoint-restart,persist=async",
                                              checkpoint_every=a.every))}
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in runs}
    order = list(runs)
    for i in range(a.repeats):
        for k in order[i % 3:] + order[:i % 3]:
            got[k].append(runs[k](i))
    sps = {k: statistics.median(r["steps_per_s"] for r in v) for k, v in got.items()}
    spread = {k: f"{min(r['steps_per_s'] for r in v):.0f}-{max(r['steps_per_s'] for r in v):.0f}"
              for k, v in got.items()}
    ratio = sps["ours"] / sps["ddp"]
    table.add("failure-free steps/s vs plain DDP",
              f"{sps['ours']:.1f} vs {sps['ddp']:.1f} steps/s = {ratio:.2f}x "
              f"(ranges {spread['ours']} / {spread['ddp']}, {a.repeats} runs each)",
              ">= 0.90x", ratio >= 0.9)
    overhead = 1 - sps["async"] / sps["ours"]
    blocked = statistics.median(1000 * r["blocked"] for r in got["async"])
    table.add(f"checkpoint-async overhead (save every {a.every} steps)",
              f"{100 * overhead:+.1f}% ({sps['async']:.1f} vs {sps['ours']:.1f} steps/s, "
              f"range {spread['async']}; training blocked {blocked:.2f} ms a save)",
              "<= 3%", overhead <= 0.03)
    acc = {k: statistics.median(r["accuracy"] for r in v) for k, v in got.items()}
    table.add("failure-free accuracy vs plain DDP",
              f"{acc['ours']:.4f} vs {acc['ddp']:.4f}", "within 2 points",
              abs(acc["ours"] - acc["ddp"]) * 100 <= ACCURACY_POINTS)


def _with_blocked(s: RunResult) -> dict[str, Any]:
    """Rank 0's result, with the seconds a save blocked training (mean per save)."""
    return {**s.extras["returned"], "blocked": s.checkpoint_blocked_seconds / max(1, s.checkpoints)}


def recoveries(a: argparse.Namespace, table: Table) -> None:
    """A rank SIGKILLed mid-allreduce, once per strategy."""
    # Long enough for the replacement (started 0.2 s after the kill, a fresh CUDA
    # context in a new process) to join before the end.
    os.environ["TT_GPU_EPOCHS"] = str(max(a.epochs, RECOVERY_EPOCHS))
    reference = ours(a, "failure-free-long").extras["returned"]
    for strategy, action, every in (("rollback", "mini-batch-rollback", None),
                                    ("lossy-forward", "lossy-forward", None),
                                    ("checkpoint-restart", "rollback-all", 10)):
        s = ours(a, f"killed-{strategy}", strategy, (KILL,), every)
        got = s.extras.get("returned") or {}
        recs = s.recoveries
        problems = []
        if s.failures != 1:
            problems.append(f"{s.failures} failures recorded")
        if [r.action for r in recs][:1] != [action]:
            problems.append(f"recoveries {[r.action for r in recs]}")
        if s.extras.get("replicas_identical") is not True:
            problems.append("replicas differ")
        if strategy == "checkpoint-restart":
            # Saves follow commits 10, 20, 30: the kill strikes the 31st step.
            if [r.restored_from for r in recs][:1] != [30]:
                problems.append(f"restored from {[r.restored_from for r in recs]}")
        elif not s.extras.get("ranks_joined"):
            problems.append("no replacement joined")
        gap = 100 * (reference["accuracy"] - got.get("accuracy", 0.0))
        if gap > ACCURACY_POINTS:
            problems.append(f"accuracy {gap:.2f} points below failure-free")
        rec_s = recs[0].recovery_seconds if recs else float("nan")
        table.add(f"SIGKILL mid-allreduce, {strategy}",
                  "; ".join(problems) or
                  f"recovered in {rec_s:.2f} s, accuracy {got.get('accuracy', 0):.4f} "
                  f"({-gap:+.2f} pts), replicas identical"
                  + (f", {s.extras.get('ranks_joined')} joined" if strategy != "checkpoint-restart"
                     else ", restored from step 30"),
                  "recovered, identical", not problems)


if __name__ == "__main__":
    sys.exit(main())
