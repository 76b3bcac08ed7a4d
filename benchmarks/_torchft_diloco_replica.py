"""One torchft DiLoCo replica group (one process) for ``benchmarks/vs_torchft_diloco.py``.

Set up as ``_torchft_replica.py`` is (a ``Manager`` over a ``ProcessGroupGloo`` on
127.0.0.1, healing over ``PGTransport``, trainthrough's ``cnn`` with its initial
parameters, data and sample order), but trained with torchft 0.2.0's ``DiLoCo``: Adam
(the inner optimizer) every step, and every ``sync_every`` steps the pseudo-gradient
averaged and applied by the outer optimizer, SGD with Nesterov momentum (lr 0.7,
momentum 0.9, as trainthrough's ``diloco`` default). The manager's synchronous quorum,
as DiLoCo requires.

    python benchmarks/_torchft_diloco_replica.py '<json spec>'

Inner step ``k`` (counted as committed outer steps x H plus the local steps since)
trains on this replica's share of our k-th global batch. The spec's ``kills`` are
inner steps: the process SIGKILLs itself before that step's update. Log records: each
committed outer step ``{"t", "step", "n"}`` (``step``: inner steps committed, H per
outer step; ``n``: replicas in it), a discarded one ``{"t", "failed"}``, a kill
``{"t", "kill"}``, the end ``{"t", "final", "accuracy"}`` on the held-out digits.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torchft import Manager, ProcessGroupGloo
from torchft.checkpointing.pg_transport import PGTransport
from torchft.local_sgd import DiLoCo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _torchft_replica import StepBatches, _loopback_store, _manager_on_loopback  # noqa: E402
from trainthrough.workloads._data import digits_split  # noqa: E402
from trainthrough.workloads.cnn import CNN, SmallConvNet  # noqa: E402


def train(spec: dict[str, Any], record: Any) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    _manager_on_loopback()
    h = int(spec["sync_every"])
    x_train, y_train, x_test, y_test = digits_split()
    x_train = x_train.view(-1, 1, 8, 8)
    batches = StepBatches(len(y_train), spec["seed"], spec["replica"], spec["replicas"],
                          spec["batch"])
    model = SmallConvNet(side=8)
    model.load_state_dict(CNN(seed=spec["seed"]).init_params(
        torch.Generator().manual_seed(spec["seed"])))
    inner = torch.optim.Adam(model.parameters(), lr=spec["lr"])
    outer = torch.optim.SGD(model.parameters(), lr=spec["outer_lr"],
                            momentum=spec["outer_momentum"], nesterov=True)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])

    store, port = _loopback_store()
    pg = ProcessGroupGloo(timeout=timedelta(seconds=spec["pg_timeout"]))
    manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"vs_diloco_{spec['replica']}",
                      store_addr="127.0.0.1", store_port=port, rank=0, world_size=1,
                      lighthouse_addr=spec["lighthouse"], hostname="127.0.0.1",
                      timeout=timedelta(seconds=30), use_async_quorum=False,
                      init_sync=False,
                      checkpoint_transport=PGTransport(pg, timedelta(seconds=10),
                                                       torch.device("cpu")))
    kills = list(spec["kills"])
    record(ready=True)
    go = Path(spec["go"])
    while not go.exists():
        time.sleep(0.01)
    local = 0
    committed = manager.current_step()
    with DiLoCo(manager, [model], inner, outer, sync_every=h):
        while manager.current_step() * h < spec["steps"]:
            k = manager.current_step() * h + local
            if kills and k >= kills[0]:
                record(kill=k)
                os.kill(os.getpid(), signal.SIGKILL)
            inner.zero_grad()
            rows = batches.rows(k)
            F.cross_entropy(model(x_train[rows]), y_train[rows]).backward()
            inner.step()  # DiLoCo's hook runs the outer step every H of these
            local += 1
            if manager.current_step() != committed:
                committed, local = manager.current_step(), 0
                record(step=committed * h, n=manager.num_participants())
            elif local >= h:  # the outer step was discarded (parameters restored)
                record(failed=committed * h)
                local = 0
    model.eval()
    with torch.no_grad():
        acc = (model(x_test.view(-1, 1, 8, 8)).argmax(1) == y_test).float().mean().item()
    record(final=manager.current_step() * h, accuracy=acc)
    manager.shutdown(wait=False)
    del store


def main() -> None:
    spec = json.loads(sys.argv[1])
    with Path(spec["log"]).open("a", buffering=1) as log:

        def record(**kw: Any) -> None:
            log.write(json.dumps({"t": time.time(), **kw}) + "\n")

        train(spec, record)


if __name__ == "__main__":
    main()
