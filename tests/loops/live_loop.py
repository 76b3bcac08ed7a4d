"""A user's loop whose ranks misbehave as the environment says (the liveness tests).

Every rank process reads, when the loop starts:

- ``TT_STEP_SLEEP=S@K``: each rank's ``loss_fn`` sleeps S seconds at committed step K;
- ``TT_COMPUTE=S``: each rank's ``loss_fn`` sleeps S seconds at every step (a step's
  compute, for a slow rank to multiply);
- ``TT_EVAL_SLEEP=S`` (``S@K``): the first rank's ``evaluate`` sleeps S seconds (only
  at committed step K);
- ``TT_RAISE_AT=K``: rank 1 raises :class:`ValueError` at step K (``TT_RAISE=own``: an
  exception class of this file), in every incarnation;
- ``TT_IGNORE_TERM=1``: the rank ignores SIGTERM (as a loop that saves on SIGTERM
  and goes on would);
- ``TT_PIDS=DIR``: each rank process writes an empty file named by its pid there.

Run as a script (``python live_loop.py OUT STRATEGY FAIL EVAL_EVERY CKPT_EVERY``) it
launches 2 ranks on gloo and prints the result as one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainthrough.loop import Loop, launch, training_loop

SAMPLES = int(os.environ.get("TT_SAMPLES", "128"))


class OwnError(Exception):
    """An exception class the driver cannot make again by name."""


def _sleep_at(spec: str) -> tuple[float, int]:
    seconds, _, step = spec.partition("@")
    return float(seconds), int(step or 0)


@training_loop(eval_every=2, checkpoint_every=4)
def train(loop: Loop) -> dict[str, object]:
    if os.environ.get("TT_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("TT_PIDS"):
        (Path(os.environ["TT_PIDS"]) / str(os.getpid())).touch()
    sleep, sleep_step = _sleep_at(os.environ.get("TT_STEP_SLEEP", "0"))
    eval_spec = os.environ.get("TT_EVAL_SLEEP", "0")
    eval_sleep, eval_step = _sleep_at(eval_spec)
    raise_at = int(os.environ.get("TT_RAISE_AT", "-1"))
    compute = float(os.environ.get("TT_COMPUTE", "0"))
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def evaluate() -> float:
        if "@" not in eval_spec or loop.step_index == eval_step:
            time.sleep(eval_sleep)
        with torch.no_grad():
            return float(F.cross_entropy(model(x), y))

    def loss_fn(batch: list[torch.Tensor]) -> torch.Tensor:
        if loop.step_index == sleep_step and sleep:
            time.sleep(sleep)
        if compute:
            time.sleep(compute)
        if loop.step_index == raise_at and loop.rank == 1:
            kind = OwnError if os.environ.get("TT_RAISE") == "own" else ValueError
            raise kind(f"bad batch at step {raise_at}")
        return F.cross_entropy(model(batch[0]), batch[1])

    loop.attach(model, opt, DataLoader(TensorDataset(x, y), batch_size=8), evaluate=evaluate)
    while loop.running(epochs=int(os.environ.get("TT_EPOCHS", "1"))):
        loop.step(loss_fn)
    return {"sum": float(sum(p.detach().double().sum() for p in model.parameters())),
            "steps": loop.step_index}


if __name__ == "__main__":
    out, strategy, fail, eval_every, ckpt = sys.argv[1:6]
    r = launch(train, ranks=2, engine="gloo", strategy=strategy,
               fail=[fail] if fail != "-" else [], out=out, progress=False,
               checkpoint_every=int(ckpt), recovery_delay=0.2)
    print(json.dumps({"returned": r.returned, "summary": r.summary.to_dict()}))
