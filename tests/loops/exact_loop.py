"""A small user's loop with arguments of its own (for the tests of ``launch``).

``train(loop, hidden=16, tag="none")`` trains a small MLP with Adam for one epoch and
returns the arguments it got and a SHA-256 of its final parameters, every bit. Run as
a script: ``python exact_loop.py OUT FAIL MICRO_BATCHES ALLREDUCE_BUCKETS OPTIONS_JSON``
(``FAIL`` ``-``: none); it prints the result as one JSON line.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainthrough.loop import Loop, launch, training_loop


@training_loop
def train(loop: Loop, hidden: int = 16, tag: str = "none") -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    y = (x[:, 0] - x[:, 2] > 0).long()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loop.attach(model, opt, DataLoader(TensorDataset(x, y), batch_size=16))
    while loop.running(epochs=1):
        loop.step(lambda batch: F.cross_entropy(model(batch[0]), batch[1]))
    h = hashlib.sha256()
    for v in model.state_dict().values():
        h.update(v.detach().numpy().tobytes())
    return {"hidden": hidden, "tag": tag, "sha256": h.hexdigest(), "steps": loop.step_index}


if __name__ == "__main__":
    out, fail, micro, buckets, options = sys.argv[1:6]
    r = launch(train, ranks=2, engine="gloo", strategy="rollback", replace=False,
               fail=[] if fail == "-" else [fail], out=out, timeout=5.0, progress=False,
               micro_batches=int(micro), allreduce_buckets=int(buckets),
               options=json.loads(options))
    print(json.dumps({"returned": r.returned, "summary": r.summary.to_dict()}))
