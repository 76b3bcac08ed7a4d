"""A user's loop with registered state, for the resume test: a StepLR stepped per epoch
(on_epoch_end), a counter of its own, momentum SGD. ``TT_DIE_AT=N`` makes rank 0 raise
after committing step N (a bug ends the whole job: nothing survives to recover).

Run as a script: ``python resume_loop.py OUT [resume]`` (``TT_ENGINE``: gloo, or ray);
it prints the result as one JSON line (or exits 1 with the traceback when it dies).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainthrough.loop import Loop, launch, training_loop


class Seen:
    """The user's own counter: committed updates, as a registered state."""

    def __init__(self) -> None:
        self.updates = 0

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.updates = int(sd["updates"])


@training_loop(checkpoint_every=10)
def train(loop: Loop) -> dict[str, object]:
    torch.manual_seed(0)
    x = torch.randn(384, 8, generator=torch.Generator().manual_seed(1))
    y = (x[:, :2].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    seen = Seen()
    die_at = int(os.environ.get("TT_DIE_AT", "-1"))

    def update() -> None:
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        seen.updates += 1

    loop.attach(model, opt, DataLoader(TensorDataset(x, y), batch_size=16),
                state={"sched": sched, "seen": seen}, on_epoch_end=lambda e: sched.step())
    while loop.running(epochs=3):
        loop.step(lambda b: F.cross_entropy(model(b[0]), b[1]), update)
        if loop.step_index == die_at and loop.rank == 0:
            raise RuntimeError(f"planned death after step {die_at}")
    return {"sum": float(sum(p.detach().double().sum() for p in model.parameters())),
            "lr": opt.param_groups[0]["lr"], "updates": seen.updates,
            "epochs_ended": sched.last_epoch}


if __name__ == "__main__":
    r = launch(train, ranks=2, engine=os.environ.get("TT_ENGINE", "gloo"),
               strategy="checkpoint-restart", out=sys.argv[1],
               progress=False, resume=sys.argv[2:] == ["resume"],
               # The planned death ends the run at its first time, as a job that died
               # whole: not retried from the checkpoint (max_restarts may differ on resume).
               max_restarts=0)
    extras = r.summary.result.extras
    print(json.dumps({"returned": r.returned, "resumed_from": extras.get("resumed_from"),
                      "identical": extras.get("replicas_identical")}))
