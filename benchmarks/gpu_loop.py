"""The byo-loop example's model on ``loop.device``, for ``benchmarks/gpu_check.py``.

Two programs with the same model, data, optimizer, per-rank batch and step count:
``train`` (a trainthrough loop, every rank started by the run) and :func:`ddp_rank`
(plain ``torch.nn.parallel.DistributedDataParallel``, the no-fault-tolerance floor).
Both time their steps after :data:`WARM` warm-up steps, without evaluation in the
timed part, and return the accuracy and a hash of the final parameters.

Settings come from the environment (ranks inherit it): ``TT_GPU_EPOCHS``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from byo_loop import Net, accuracy, blobs  # noqa: E402

from trainthrough.loop import Loop, training_loop  # noqa: E402

WARM = 5  # steps before the clock starts (CUDA kernels load, allocator warms up)
BATCH = 32  # per rank, as in the example


def epochs() -> int:
    return int(os.environ.get("TT_GPU_EPOCHS", "3"))


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    # Parameters only: DDP syncs buffers from rank 0 at each forward, so after the last
    # step another rank's BatchNorm statistics are its own batch's.
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@training_loop(metric="accuracy", direction="max", eval_every=10**6)
def train(loop: Loop) -> dict[str, float | str]:
    torch.manual_seed(0)
    model = Net().to(loop.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(blobs(6000, seed=0), batch_size=BATCH)
    test = blobs(2000, seed=1)
    test.tensors = tuple(t.to(loop.device) for t in test.tensors)

    def loss_of(batch: list[torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    loop.attach(model, opt, loader, evaluate=lambda: accuracy(model, test))
    t0, n0, t_end = 0.0, 0, 0.0
    while loop.running(epochs=epochs()):
        loop.step(loss_of)
        if loop.device.type == "cuda":
            torch.cuda.synchronize(loop.device)
        t_end = time.perf_counter()
        if loop.step_index == WARM:
            t0, n0 = t_end, loop.step_index
    steps = loop.step_index - n0
    return {"accuracy": accuracy(model, test), "steps": loop.step_index,
            "steps_per_s": steps / (t_end - t0) if t0 and t_end > t0 else float("nan"),
            "params": digest(model)}


def ddp_rank(rank: int, world: int, port: int, device: str, out: Path) -> None:
    """One rank of the plain-DDP floor (a process of its own: ``python gpu_loop.py
    RANK WORLD PORT DEVICE OUT.json``); its result goes to ``out`` as JSON."""
    dev = torch.device(device)
    torch.set_num_threads(1)  # as trainthrough's ranks (rank_main.py): one per rank
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = Net().to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = blobs(6000, seed=0)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0,
                                 drop_last=True)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)
    step, t0, t_end = 0, 0.0, 0.0
    for epoch in range(epochs()):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            step += 1
            t_end = time.perf_counter()
            if step == WARM:
                t0 = t_end
    test = blobs(2000, seed=1)
    test.tensors = tuple(t.to(dev) for t in test.tensors)
    result = {"accuracy": accuracy(model, test), "steps": step,
           "steps_per_s": (step - WARM) / (t_end - t0), "params": digest(model)}
    out.write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    r, w, port, dev, path = sys.argv[1:6]
    ddp_rank(int(r), int(w), int(port), dev, Path(path))
