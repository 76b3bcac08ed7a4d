"""A user's loop that writes down every sample its loss function sees (for the tests).

Each rank process appends ``step attempt rank index...`` lines to its own file in
``$TT_LEDGER`` (a SIGKILLed process keeps what it flushed). Run as a script:
``python ledger_loop.py ENGINE STRATEGY FAIL OUT [RAY_ADDRESS]``; it prints the
result as one JSON line. ``$TT_LAUNCH``: more arguments of ``launch``, as a JSON object
(they replace the defaults below).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainthrough.ft.strategy import resolve
from trainthrough.loop import Loop, launch, training_loop

SAMPLES = 1536


class Indexed(Dataset):  # type: ignore[type-arg]
    """Samples that carry their own index."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(SAMPLES, 8, generator=g)
        self.y = (self.x[:, 0] + self.x[:, 1] > 0).long()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


@training_loop
def train(loop: Loop) -> dict[str, object]:
    # Whether this rank process found what its first optimizer imports already there
    # (inherited from the zygote, engines/gloo/zygote_main.py) rather than paying it.
    warm = "torch._dynamo" in sys.modules
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    # SGD: Adam's division by sqrt(v) amplifies the float summation order of 3 ranks vs 2
    # (measured: 0.6% on the sum of the parameters), which would hide a real difference.
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(Indexed(), batch_size=16)
    log = open(os.path.join(os.environ["TT_LEDGER"], f"{os.getpid()}.txt"), "a")  # noqa: SIM115
    pause = float(os.environ.get("TT_STEP_SLEEP", "0"))  # a slower step (the two-host test)

    def loss_of(batch: list[torch.Tensor]) -> torch.Tensor:
        x, y, idx = batch
        log.write(f"{loop.step_index} {loop.attempt} {loop.rank} "
                  f"{' '.join(str(int(i)) for i in idx)}\n")
        log.flush()
        if pause:
            time.sleep(pause)
        return F.cross_entropy(model(x), y)

    loop.attach(model, opt, loader)
    while loop.running(epochs=2):
        loop.step(loss_of)
    sd = model.state_dict()
    return {"sum": float(sum(v.double().sum() for v in sd.values() if v.is_floating_point())),
            "steps": loop.step_index, "file": __file__, "warm": warm}


if __name__ == "__main__":
    engine, strategy, fail, out = sys.argv[1:5]
    address = sys.argv[5] if len(sys.argv) > 5 else None
    saves = resolve(strategy).checkpoint != "none"  # an interval only where it is read
    args = {"recovery_delay": 1.0, "timeout": 5.0, "checkpoint_every": 10 if saves else None,
            **json.loads(os.environ.get("TT_LAUNCH", "{}"))}
    r = launch(train, ranks=3, engine=engine, strategy=strategy,
               fail=[fail] if fail != "-" else [], out=out, ray_address=address,
               progress=False, **args)
    summary = r.summary.to_dict()  # as summary.json has it
    print(json.dumps({"returned": r.returned, "committed": r.committed,
                      "summary": {k: summary.get(k) for k in
                                  ("failures", "recoveries", "rank_nodes", "ranks_final",
                                   "ranks_joined", "replicas_identical", "writes_refused")}}))
