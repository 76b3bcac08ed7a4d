"""The programs ``benchmarks/scale.py`` runs: one GPT-2-shaped model, three ways.

- :func:`train`: the model trained through ``trainthrough.loop`` (a user's own loop:
  AdamW with weight-decay groups, gradient clipping in ``update``), started by
  ``python _scale_gpt.py launch OUT.json``, which calls ``launch()`` as a user's script
  does (the run's defaults, gloo, 2 ranks);
- ``python _scale_gpt.py workload OUT.json``: a ``TorchWorkload`` given by reference
  (``--workload file.py:build``), run as ``trainthrough run --paradigm dp`` runs it;
- ``python _scale_gpt.py ddp RANK WORLD PORT OUT.json``: one rank of the same model,
  optimizer, per-rank batch and step count under plain
  ``torch.nn.parallel.DistributedDataParallel`` (gloo), the floor without fault
  tolerance; ``bcast``: a plain ``dist.broadcast`` of a number of bytes between two
  ranks (what a joiner's state transfer is compared with).

Every setting comes from the environment variable ``TT_SCALE`` (a JSON object, see
:class:`Settings`), which rank processes inherit. Each program times its steps from
step :data:`WARM` on (start-up and the first steps apart) and reports its peak RSS.

The data is synthetic and needs no network: token sequences of a fixed random chain
over GPT-2's 50,257 tokens (every other token on average is ``follow[previous]``, a
fixed permutation; the others are drawn from a Zipf law, s = 1.1, as words in text),
so the loss falls from the first steps (10M, 24 steps: from 10.8 to 8.5) and a
recovered run's final loss is comparable with a failure-free one's.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from char_gpt import GPT, GPTConfig  # noqa: E402

from trainthrough.loop import Loop, launch, training_loop  # noqa: E402

VOCAB = 50257  # GPT-2's tokenizer
#: (layers, width, heads) per size: 124M is GPT-2 small; the others keep its vocabulary.
SHAPES = {"10M": (6, 160, 5), "50M": (8, 512, 8), "124M": (12, 768, 12)}
WARM = 3  # steps before the clock starts
LR, WEIGHT_DECAY, BETAS, CLIP = 6e-4, 0.1, (0.9, 0.95), 1.0
ENV = "TT_SCALE"


@dataclass(frozen=True)
class Settings:
    """One run's settings (``TT_SCALE``); the same for ours and plain DDP."""

    size: str = "10M"
    block: int = 256
    batch: int = 4  # sequences per rank per step
    steps: int = 30
    ranks: int = 2
    device: str = "cpu"
    seed: int = 0
    # one trainthrough run (``launch``/``workload``):
    strategy: str = "rollback"
    fail: str = ""
    checkpoint_every: int | None = None
    out: str = ""
    workload: str = ""  # a TorchWorkload by reference, instead of the GPT
    executed: int = 0  # a workload's run: executed steps to reach ``steps`` (0: steps)

    @staticmethod
    def from_env() -> Settings:
        return Settings(**json.loads(os.environ[ENV]))

    def env(self) -> dict[str, str]:
        return {**os.environ, ENV: json.dumps(asdict(self))}


def gpt_config(s: Settings) -> GPTConfig:
    layers, width, heads = SHAPES[s.size]
    return GPTConfig(block_size=s.block, vocab_size=VOCAB, n_layer=layers, n_head=heads,
                     n_embd=width, dropout=0.0)


def parameters(s: Settings) -> int:
    """The model's parameter count (tied embeddings counted once)."""
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(gpt_config(s)).parameters())


def tokens(s: Settings, sequences: int, seed: int) -> TensorDataset:
    """``sequences`` windows of ``block + 1`` tokens of the chain: inputs, targets."""
    g = torch.Generator().manual_seed(1234)
    follow = torch.randperm(VOCAB, generator=g)  # the chain, the same for every split
    zipf = 1.0 / torch.arange(1, VOCAB + 1, dtype=torch.float64) ** 1.1
    g.manual_seed(seed)
    n = s.block + 1
    seq = torch.multinomial(zipf, sequences * n, replacement=True, generator=g).view(sequences, n)
    chained = torch.rand(sequences, n, generator=g) < 0.5
    for t in range(1, n):
        seq[:, t] = torch.where(chained[:, t], follow[seq[:, t - 1]], seq[:, t])
    return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


def train_data(s: Settings) -> TensorDataset:
    """Exactly ``steps`` global batches: one epoch is the run."""
    return tokens(s, s.steps * s.batch * s.ranks, seed=1)


def peak_rss() -> int:
    """This process's peak resident set size, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(times: list[float]) -> float:
    """Steps per second from step WARM on (``times[i]``: when step i+1 ended)."""
    if len(times) <= WARM + 1:
        return float("nan")
    return (len(times) - WARM) / (times[-1] - times[WARM - 1])


def _optimizer(model: GPT) -> torch.optim.AdamW:
    return model.configure_optimizers(WEIGHT_DECAY, LR, BETAS)


@torch.no_grad()
def val_loss(model: torch.nn.Module, s: Settings, device: torch.device) -> float:
    x, y = (t.to(device) for t in tokens(s, 4, seed=2).tensors)
    model.eval()
    _, loss = model(x, y)
    model.train()
    return float(loss)


# -- ours: a user's loop ---------------------------------------------------------------
@training_loop(metric="val_loss", direction="min", eval_every=10**6)
def train(loop: Loop) -> dict[str, Any]:
    s = Settings.from_env()
    if loop.device.type != s.device:  # scale.py hides the GPUs for --device cpu
        raise RuntimeError(f"--device {s.device}, but the run put rank {loop.rank} on "
                           f"{loop.device}")
    torch.manual_seed(s.seed)
    model = GPT(gpt_config(s)).to(loop.device)
    opt = _optimizer(model)

    def loss_of(batch: list[torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return model(x, y)[1]

    def update() -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()

    loop.attach(model, opt, DataLoader(train_data(s), batch_size=s.batch),
                evaluate=lambda: val_loss(model, s, loop.device))
    times: list[float] = []
    while loop.running(epochs=1):
        loop.step(loss_of, update)
        _sync(loop.device)
        times.append(time.perf_counter())
    return {"steps": loop.step_index, "steps_per_s": _rate(times),
            "loss": val_loss(model, s, loop.device), "peak_rss": peak_rss()}


def run_launch(out: Path) -> None:
    """One trainthrough run of :func:`train` with the launch() defaults; its summary
    and the first rank's result go to ``out``."""
    s = Settings.from_env()
    r = launch(train, ranks=s.ranks, engine="gloo", strategy=s.strategy, seed=s.seed,
               fail=[s.fail] if s.fail else [], checkpoint_every=s.checkpoint_every,
               out=s.out, overwrite=True, progress=False)
    out.write_text(json.dumps({"summary": r.summary.to_dict(), "returned": r.returned,
                               "driver_peak_rss": peak_rss()}))


def run_workload(out: Path) -> None:
    """One run of a TorchWorkload by reference, as ``trainthrough run --paradigm dp``
    (the command line's defaults); ``steps`` executed steps, evaluated every
    :func:`eval_every` (the rate is measured between evaluations)."""
    from trainthrough.config import RunConfig
    from trainthrough.lab import runner

    s = Settings.from_env()
    cfg = RunConfig(workload=s.workload, paradigm="dp", engine="gloo", ranks=s.ranks,
                    strategy=s.strategy, failures=[s.fail] if s.fail else [], seed=s.seed,
                    max_iterations=s.executed or s.steps, eval_every=eval_every(s),
                    stop_at_target=False,
                    checkpoint_every=s.checkpoint_every, device=s.device)
    summary = runner.run(cfg, Path(s.out), overwrite=True)
    out.write_text(json.dumps({"summary": summary.to_dict(), "returned": None,
                               "driver_peak_rss": peak_rss()}))


def eval_every(s: Settings) -> int:
    return max(1, (s.steps - WARM) // 3)


# -- plain DDP, the floor --------------------------------------------------------------
def _ddp_model(s: Settings, dev: torch.device) -> tuple[torch.nn.Module, Any, Any, Any, int]:
    """The model, its loss, optimizer, data and per-rank batch, as ours trains them."""
    if not s.workload:
        torch.manual_seed(s.seed)
        model = GPT(gpt_config(s)).to(dev)
        return model, lambda m, x, y: m(x, y)[1], _optimizer(model), train_data(s), s.batch
    from trainthrough.workloads import make_workload

    w = make_workload(s.workload, seed=s.seed)
    model = w.model.to(dev)  # type: ignore[attr-defined]
    x0 = w.init_params(torch.Generator().manual_seed(s.seed))
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(x0[n])
    spec = w.default_optimizer
    if spec.kind == "adam":
        opt: Any = torch.optim.Adam(model.parameters(), lr=spec.lr, betas=spec.betas,
                                    eps=spec.eps)
    elif spec.kind in ("sgd", "momentum"):
        opt = torch.optim.SGD(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay,
                              momentum=spec.momentum if spec.kind == "momentum" else 0.0)
    else:
        raise SystemExit(f"scale: a {spec.kind!r} optimizer has no plain-DDP twin")
    data = TensorDataset(w.x_train, w.y_train)  # type: ignore[attr-defined]
    return (model, lambda m, x, y: w.loss_fn(m(x), y), opt, data,  # type: ignore[attr-defined]
            w.batch_size)


def ddp_rank(rank: int, world: int, port: int, out: Path) -> None:
    s = Settings.from_env()
    dev = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if s.device == "cuda"
                       else "cpu")
    torch.set_num_threads(1)  # as trainthrough's ranks (rank_main.py)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    model, loss_fn, opt, data, batch = _ddp_model(s, dev)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[dev.index] if dev.type == "cuda" else None)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True,
                                 seed=s.seed, drop_last=True)
    times: list[float] = []
    epoch = 0
    while len(times) < s.steps:
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=batch, sampler=sampler, drop_last=True):
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss_fn(ddp, x, y).backward()
            if not s.workload:
                torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            _sync(dev)
            times.append(time.perf_counter())
            if len(times) == s.steps:
                break
        epoch += 1
    out.write_text(json.dumps({"steps": len(times), "steps_per_s": _rate(times),
                               "peak_rss": peak_rss()}))
    dist.destroy_process_group()


def bcast_rank(rank: int, port: int, nbytes: int, repeats: int, out: Path) -> None:
    """A plain broadcast of ``nbytes`` from rank 0 to rank 1, ``repeats`` times: each
    rank's seconds per broadcast (the buffer allocated before the clock starts)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=300))
    buf = (torch.ones if rank == 0 else torch.zeros)(nbytes, dtype=torch.uint8)
    took = []
    for _ in range(repeats):
        dist.barrier()
        t = time.perf_counter()
        dist.broadcast(buf, src=0)
        took.append(time.perf_counter() - t)
    ok = rank == 0 or bool(buf[-1] == 1)
    out.write_text(json.dumps({"seconds": took, "received": ok}))
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "launch":
        run_launch(Path(args[0]))
    elif mode == "workload":
        run_workload(Path(args[0]))
    elif mode == "ddp":
        ddp_rank(int(args[0]), int(args[1]), int(args[2]), Path(args[3]))
    elif mode == "bcast":
        bcast_rank(int(args[0]), int(args[1]), int(args[2]), int(args[3]), Path(args[4]))
    else:
        raise SystemExit(f"_scale_gpt.py: unknown mode {mode!r}")
