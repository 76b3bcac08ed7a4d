"""Peak memory and speed per rank: trainthrough's gloo data parallel next to plain DDP.

The model is GPT-shaped (causal self-attention, learned positions, tied embeddings),
sized by ``--params`` (millions: 10, 25, 50, 124; 124 is GPT-2 small's shape), trained
with AdamW on random tokens. Three programs train it on 2 ranks with the same
per-rank batch and step count, each in processes of its own:

- ``ddp``: plain ``torch.nn.parallel.DistributedDataParallel`` over gloo (its
  defaults: 25 MB buckets, gradients copied into them), one process per rank;
- ``free``: a ``trainthrough.loop`` on the gloo engine, no failure (strategy rollback);
- ``rollback``: the same with rank 1 SIGKILLed at its step ``--kill-at`` as its first
  gradient bucket starts (``phase=allreduce:0``, inside its backward); the survivor
  redoes the step, a replacement joins with its state and trains to the end;
- ``lossy``: the same kill under lossy-forward (the survivor finishes the step without
  rank 1's share, measuring the failure-free step beside it), then the replacement;
- ``restart``: the same kill under checkpoint-restart, a checkpoint every 2 steps:
  every rank starts again from the last one.

Each rank process writes its record after every step (so a killed one leaves one):
its peak resident memory (``VmHWM`` of ``/proc/self/status``, which counts the
pages of torch's libraries it shares with its parent as any process's RSS does)
and the seconds of its steps after ``WARM`` warm-up steps. Reported per program: the
largest peak over its ranks (the killed rank excluded), and the ratio to DDP; the
free steps/s (median over ranks) and its ratio to DDP. ``--repeats`` runs the
programs interleaved (the order turns each round); the machine is shared, so the
figures are as noisy as its load.

    python benchmarks/memory.py [--params 25] [--steps 10] [--kill-at 4] [--repeats 1]
                                [--batch 4] [--block 128] [--only ddp,free,rollback]

Settings reach the rank processes through the environment (``TT_MEM_*``), so every
measurement runs in a fresh driver process of its own (``--one PROGRAM``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from char_gpt import GPT, GPTConfig  # noqa: E402

from trainthrough.loop import Loop, launch, training_loop  # noqa: E402

WARM = 2  # steps before the clock starts
RANKS = 2


# -- the model -----------------------------------------------------------------------
#: (layers, width, heads, vocabulary) per size in millions; 124 is GPT-2 small. The model
#: is examples/char_gpt.py's GPT (as benchmarks/scale.py's), without dropout.
SHAPES = {10: (4, 384, 6, 8192), 25: (6, 512, 8, 10000), 50: (8, 640, 10, 16384),
          124: (12, 768, 12, 50257)}


# -- settings, through the environment -------------------------------------------------
def settings() -> dict[str, Any]:
    e = os.environ
    return {"params": int(e.get("TT_MEM_PARAMS", "25")), "steps": int(e.get("TT_MEM_STEPS", "10")),
            "batch": int(e.get("TT_MEM_BATCH", "4")), "block": int(e.get("TT_MEM_BLOCK", "128")),
            "records": e.get("TT_MEM_RECORDS", "")}


def build(s: dict[str, Any]) -> tuple[GPT, TensorDataset]:
    torch.manual_seed(0)
    layers, width, heads, vocab = SHAPES[s["params"]]
    model = GPT(GPTConfig(block_size=s["block"], vocab_size=vocab, n_layer=layers,
                          n_head=heads, n_embd=width, dropout=0.0))
    n = s["steps"] * s["batch"] * RANKS
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (n, s["block"] + 1), generator=g)
    return model, TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def optimizer(model: nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


class Recorder:
    """One JSON file per process, rewritten after every step."""

    def __init__(self, folder: str, program: str, slot: int) -> None:
        self.path = Path(folder) / f"{program}-{slot}-{os.getpid()}.json"
        self.rec: dict[str, Any] = {"program": program, "slot": slot, "pid": os.getpid(),
                                    "steps": 0, "seconds": 0.0, "timed": 0}
        self.t = time.perf_counter()

    def step(self, index: int) -> None:
        now = time.perf_counter()
        if index > WARM:
            self.rec["seconds"] += now - self.t
            self.rec["timed"] += 1
        self.t = now
        self.rec["steps"] = index
        self.write()

    def write(self) -> None:
        self.rec["peak_mb"] = peak_mb()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.rec))
        tmp.replace(self.path)


# -- trainthrough's loop --------------------------------------------------------------
@training_loop(metric="loss", eval_every=10**6, checkpoint_every=10**6)
def train(loop: Loop) -> None:
    torch.set_num_threads(1)
    s = settings()
    model, data = build(s)
    opt = optimizer(model)

    def loss_of(batch: list[torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return model(x, y)[1]

    loop.attach(model, opt, DataLoader(data, batch_size=s["batch"]))
    rec = Recorder(s["records"], os.environ.get("TT_MEM_PROGRAM", "tt"), loop.rank)
    rec.write()
    while loop.running(epochs=1):
        loop.step(loss_of)
        rec.step(loop.step_index)


STRATEGY = {"free": "rollback", "rollback": "rollback", "lossy": "lossy-forward",
            "restart": "checkpoint-restart"}


def run_loop(program: str, kill_at: int, folder: Path) -> None:
    fail = [f"rank=1@iter={kill_at},phase=allreduce:0"] if program != "free" else []
    launch(train, ranks=RANKS, engine="gloo", strategy=STRATEGY[program], fail=fail,
           out=folder / "run", overwrite=True, progress=False, recovery_delay=0.5,
           timeout=120.0, checkpoint_every=2 if program == "restart" else None)


# -- plain DDP -------------------------------------------------------------------------
def ddp_rank(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    s = settings()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=RANKS, timeout=timedelta(seconds=300))
    model, data = build(s)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = optimizer(model)
    rec = Recorder(s["records"], "ddp", rank)
    rec.write()
    b = s["batch"]
    for step in range(s["steps"]):
        at = (step * RANKS + rank) * b
        x, y = data.tensors[0][at:at + b], data.tensors[1][at:at + b]
        ddp(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        rec.step(step + 1)
    dist.destroy_process_group()


def run_ddp() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--ddp-rank", str(r), "--port", str(port)])
             for r in range(RANKS)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"plain DDP ranks exited with {codes}")


# -- the driver ------------------------------------------------------------------------
def measure(program: str, a: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    """Run ``program`` in a driver process of its own; its ranks' records."""
    records = folder / f"{program}-records"
    records.mkdir(parents=True)
    env = {**os.environ, "TT_MEM_PARAMS": str(a.params), "TT_MEM_STEPS": str(a.steps),
           "TT_MEM_BATCH": str(a.batch), "TT_MEM_BLOCK": str(a.block),
           "TT_MEM_RECORDS": str(records), "TT_MEM_PROGRAM": program}
    t = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--one", program, "--kill-at", str(a.kill_at),
                    "--folder", str(folder / program)], env=env, check=True)
    recs = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    print(f"  {program}: {time.perf_counter() - t:.0f} s, " + ", ".join(
        f"slot {r['slot']} pid {r['pid']} {r['peak_mb']:.0f} MB ({r['steps']} steps)"
        for r in recs), file=sys.stderr, flush=True)
    return recs


def summarize(program: str, recs: list[dict[str, Any]], steps: int) -> dict[str, float]:
    """The largest peak over the ranks that finished (a restart's new processes
    included), and the median steps/s."""
    done = [r for r in recs if r["steps"] == steps] or recs
    rates = [r["timed"] / r["seconds"] for r in done if r["seconds"] > 0]
    return {"peak_mb": max(r["peak_mb"] for r in done),
            "steps_per_s": statistics.median(rates) if rates else math.nan}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=int, default=25, choices=sorted(SHAPES))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--block", type=int, default=128, help="tokens per sequence")
    p.add_argument("--kill-at", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--only", default="ddp,free,rollback",
                   help=f"programs, comma-separated: ddp, {', '.join(STRATEGY)}")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--ddp-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.ddp_rank is not None:
        ddp_rank(a.ddp_rank, a.port)
        return 0
    if a.one == "ddp":
        run_ddp()
        return 0
    if a.one is not None:
        run_loop(a.one, a.kill_at, Path(a.folder))
        return 0
    if not WARM < a.kill_at < a.steps:
        p.error(f"--kill-at must be between {WARM + 1} and {a.steps - 1}")
    programs = a.only.split(",")
    unknown = set(programs) - {"ddp", *STRATEGY}
    if unknown:
        p.error(f"unknown programs {sorted(unknown)} (use ddp, {', '.join(STRATEGY)})")
    n = sum(t.numel() for t in build({**settings(), "params": a.params, "steps": 1})[0]
            .parameters())
    print(f"GPT {n / 1e6:.1f}M parameters, {RANKS} ranks, batch {a.batch}x{a.block} per "
          f"rank, {a.steps} steps", file=sys.stderr)
    results: dict[str, list[dict[str, float]]] = {q: [] for q in programs}
    with tempfile.TemporaryDirectory(prefix="tt-memory-") as tmp:
        for i in range(a.repeats):
            order = programs if i % 2 == 0 else programs[::-1]
            for q in order:
                folder = Path(tmp) / f"r{i}"
                results[q].append(summarize(q, measure(q, a, folder), a.steps))
    ddp = results.get("ddp")
    print("\n| program | peak RSS per rank (MB) | x DDP | steps/s | x DDP |\n|---|---|---|---|---|")
    for q, rs in results.items():
        peak = statistics.median(r["peak_mb"] for r in rs)
        sps = statistics.median(r["steps_per_s"] for r in rs)
        rp = peak / statistics.median(r["peak_mb"] for r in ddp) if ddp else math.nan
        rs_ = sps / statistics.median(r["steps_per_s"] for r in ddp) if ddp else math.nan
        print(f"| {q} | {peak:.0f} | {rp:.2f} | {sps:.3f} | {rs_:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
