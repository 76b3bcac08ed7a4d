"""One torchft replica group (one process) for ``benchmarks/vs_torchft.py``.

Written the way torchft's own ``train_ddp.py`` is: a ``Manager`` over a
``ProcessGroupGloo``, its ``DistributedDataParallel`` and ``OptimizerWrapper``, the
checkpoint of a healing replica sent over the process group (``PGTransport``). The
model, its initial parameters, data, batch, optimizer and sample order are the ones of
trainthrough's ``cnn`` workload on our data-parallel engines: committed step k trains
on the k-th global batch of our epoch permutation (``dp/batching.SampleStream``), each
replica on its contiguous share, as our ranks do, so that without failures both
systems compute the same steps and a difference in accuracy comes from recovery. A
replica that is alone trains on its own share only (the dead replica's share of the
step is lost, torchft's behaviour).

    python benchmarks/_torchft_replica.py '<json spec>'

The spec names the replica, the lighthouse, the step count, the steps at which this
process SIGKILLs itself (at the allreduce of that step, before sending anything: the
point ``phase=allreduce:0`` names for trainthrough) and a log file. Each committed
step appends ``{"t", "step", "n"}`` (wall time, steps committed, replicas in it) to
the log; a failed step ``{"t", "failed"}``; a kill ``{"t", "kill"}`` just before the
signal; the end ``{"t", "final", "accuracy"}`` on the held-out digits.

Everything listens on 127.0.0.1: the replica's store is bound there and handed over,
and torchft 0.2.0's manager server, which binds every interface (``[::]``) by itself,
is given a loopback bind address (a wrapper around its constructor; nothing else of
torchft is changed).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchft.manager
from torchft import (
    DistributedDataParallel,
    Manager,
    Optimizer,
    ProcessGroupGloo,
)
from torchft.checkpointing.pg_transport import PGTransport

from trainthrough.dp.batching import Cursor, SampleStream, plan_batch
from trainthrough.workloads._data import digits_split
from trainthrough.workloads.cnn import CNN, SmallConvNet

Record = Callable[..., None]


def _loopback_store() -> tuple[dist.TCPStore, int]:
    """The replica group's ``TCPStore``, listening on 127.0.0.1 only (it binds every
    interface when it opens the port itself); the store owns the socket afterwards."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30), master_listen_fd=sock.fileno())
    sock.detach()
    return store, port


def _manager_on_loopback() -> None:
    """torchft 0.2.0's Manager starts its ManagerServer with ``bind="[::]:port"``
    (every interface); give it 127.0.0.1 instead. Nothing else changes."""
    server = torchft.manager.ManagerServer

    def loopback_server(**kw: Any) -> Any:
        kw["bind"] = "127.0.0.1:0"
        return server(**kw)

    torchft.manager.ManagerServer = loopback_server  # type: ignore[misc]


def _kill_at(manager: Manager, kills: list[int], record: Record) -> None:
    """SIGKILL this process at the allreduce of the first step at or after each of
    ``kills`` (committed steps before it), before anything is sent."""
    allreduce = manager.allreduce

    def allreduce_or_die(tensor: torch.Tensor, *a: Any, **kw: Any) -> Any:
        manager.wait_quorum()  # a healing replica learns its step here
        if kills and manager.current_step() >= kills[0]:
            record(kill=manager.current_step())
            os.kill(os.getpid(), signal.SIGKILL)
        return allreduce(tensor, *a, **kw)

    manager.allreduce = allreduce_or_die  # type: ignore[method-assign]


def _average_gradients(manager: Manager, model: torch.nn.Module) -> None:
    """One ``manager.allreduce`` of every gradient (DDP's one bucket for this model).
    A failed allreduce is reported to the manager, which then votes not to commit."""
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
    manager.allreduce(flat).wait()
    i = 0
    for p in params:
        p.grad.copy_(flat[i:i + p.numel()].view_as(p))  # type: ignore[union-attr]
        i += p.numel()


class StepBatches:
    """The rows replica ``replica`` of ``replicas`` trains on at committed step k: its
    share of our k-th global batch, planned by our ranks' own code (``plan_batch``,
    one micro-batch per rank as the benchmark runs ours)."""

    def __init__(self, n: int, seed: int, replica: int, replicas: int, batch: int) -> None:
        self.stream = SampleStream(n, seed)
        self.replica, self.members, self.batch = replica, range(replicas), batch
        self.cursors = [Cursor()]  # cursors[k]: where the k-th global batch starts
        self.mine: list[torch.Tensor] = []  # mine[k]: this replica's rows of batch k

    def rows(self, step: int) -> torch.Tensor:
        while len(self.mine) <= step:
            plan = plan_batch(self.stream, self.cursors[-1], len(self.members) * self.batch,
                              1.0, self.members, self.batch)
            self.mine.append(torch.cat([m.rows for m in plan.share[self.replica]]))
            self.cursors.append(plan.next_cursor)
        return self.mine[step]


def train(spec: dict[str, Any], record: Record) -> None:
    """Set up as torchft's train_ddp.py does, train ``spec["steps"]`` committed steps,
    evaluate on the held-out digits."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)  # one core per replica, as trainthrough's ranks
    _manager_on_loopback()
    x_train, y_train, x_test, y_test = digits_split()  # cnn's loader: the same split
    x_train = x_train.view(-1, 1, 8, 8)
    batches = StepBatches(len(y_train), spec["seed"], spec["replica"], spec["replicas"],
                          spec["batch"])
    model = SmallConvNet(side=8)  # starts where our ranks start: the workload's x0
    x0 = CNN(seed=spec["seed"]).init_params(torch.Generator().manual_seed(spec["seed"]))
    model.load_state_dict(x0)
    adam = torch.optim.Adam(model.parameters(), lr=spec["lr"])

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": adam.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        adam.load_state_dict(sd["optim"])

    store, port = _loopback_store()
    pg = ProcessGroupGloo(timeout=timedelta(seconds=spec["pg_timeout"]))
    manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"vs_torchft_{spec['replica']}",
                      store_addr="127.0.0.1", store_port=port, rank=0, world_size=1,
                      lighthouse_addr=spec["lighthouse"], hostname="127.0.0.1",
                      timeout=timedelta(seconds=30),
                      # Every replica starts from the same x0 (torchft's documented case
                      # for init_sync=False); with True, step 0 heals replica 1 from 0 and
                      # drops its gradient. A restarted replica still heals (step behind).
                      init_sync=False,
                      checkpoint_transport=PGTransport(pg, timedelta(seconds=10),
                                                       torch.device("cpu")))
    _kill_at(manager, list(spec["kills"]), record)
    opt = Optimizer(manager, adam)
    forward = DistributedDataParallel(manager, model) if spec["ddp"] else model
    record(ready=True)
    go = Path(spec["go"])
    while not go.exists():  # the first start: every replica is heartbeating first
        time.sleep(0.01)

    while manager.current_step() < spec["steps"]:
        opt.zero_grad()  # starts the quorum, which overlaps the forward and backward
        # The step being attempted. A replica healing in this quorum learns its step
        # only inside it, but its gradients are zeroed for this step (torchft's
        # is_participating), so the rows it trains on here do not matter.
        before = manager.current_step()
        rows = batches.rows(before)
        F.cross_entropy(forward(x_train[rows]), y_train[rows]).backward()
        if not spec["ddp"]:
            _average_gradients(manager, model)
        opt.step()  # only if the manager's vote says commit
        if manager.current_step() > before:
            record(step=manager.current_step(), n=manager.num_participants())
        else:
            record(failed=before)
    model.eval()
    with torch.no_grad():
        acc = (model(x_test.view(-1, 1, 8, 8)).argmax(1) == y_test).float().mean().item()
    record(final=manager.current_step(), accuracy=acc)
    manager.shutdown(wait=False)
    del store


def main() -> None:
    spec = json.loads(sys.argv[1])
    with Path(spec["log"]).open("a", buffering=1) as log:

        def record(**kw: Any) -> None:
            log.write(json.dumps({"t": time.time(), **kw}) + "\n")  # line-buffered

        train(spec, record)


if __name__ == "__main__":
    main()
