"""A parameter-server worker hosted in a Ray actor, running at its own pace.

Each step: pull every shard (from the replica that serves reads), compute the
workload's update with the same :class:`~trainthrough.ps.worker.Worker` code as
every engine, push each shard its slice, and wait for the acknowledgements.

When a shard is unreachable the outage policy decides: ``wait`` (look up the
shard's new replica in the registry, retry the same push — its sequence number
makes a retry safe) or ``buffer`` (the stateless PS: keep computing on the last
parameters held, queue the slices for that shard in a bounded backlog, and apply
them with the merge rule when the shard is back).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import ray
import torch

from trainthrough.ft.outage import Backlog, merge_plan
from trainthrough.ps.layout import Layout
from trainthrough.ps.worker import Worker
from trainthrough.workloads import make_workload

Tensors = dict[str, torch.Tensor]
# While a shard is down its replacement is announced by the driver (``shard_changed``);
# the registry is still polled this often in case an announcement is missed.
RECHECK = 1.0


def _add(a: Tensors, b: Tensors) -> Tensors:
    return {n: a[n] + b[n] if n in b else a[n] for n in a} | {n: b[n] for n in b if n not in a}


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)  # type: ignore[call-overload]
class WorkerActor:
    """One worker; ``run`` loops until ``stop``; ``progress`` can be called meanwhile."""

    def __init__(self, worker_id: int, workload: str, options: dict[str, Any], seed: int,
                 num_workers: int, layout: Layout, registry: Any, settings: dict[str, Any],
                 start_step: int = 0, incarnation: int = 0) -> None:
        torch.set_num_threads(1)
        wl = make_workload(workload, seed=seed, **options)
        self.layout = layout
        self.worker = Worker(worker_id, wl, wl.partition(num_workers)[worker_id], seed)
        self.registry = registry
        self.s = settings  # outage, merge_rule, merge_threshold, read_from, backlog, scale
        self.step = start_step
        # Sequence numbers strictly above any an earlier incarnation of this worker used
        # (each does far fewer than 2**40 pushes): a replacement's pushes are never
        # mistaken for duplicates of its predecessor's and dropped.
        self.seq = incarnation << 40
        self._stop = threading.Event()
        self._handles: dict[int, tuple[int, Any, Any]] = {}  # shard -> (epoch, write, read)
        self._recheck: dict[int, float] = {}  # shard -> when to ask the registry again
        self._params: Tensors | None = None
        self._backlogs = [Backlog[Tensors](settings.get("backlog", 256))
                          for _ in layout.shards]
        # busy: computing; idle: waiting for a shard that is down; comm: the rest
        # (pulls and pushes that went through).
        self.busy = self.idle = self.comm = 0.0
        self.pushes = self.duplicates_skipped = self.buffered = 0
        self.acked: dict[int, int] = {}  # shard -> highest sequence number acknowledged
        self.worker.start(wl.init_params(torch.Generator().manual_seed(seed)), incarnation)

    def whoami(self) -> tuple[int, str]:
        """(pid, node id): the driver signals this process only if it is on its node."""
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def watch(self) -> None:
        threading.Event().wait()

    def shard_changed(self, i: int) -> None:
        """The driver says who serves shard ``i`` changed: look it up on next use."""
        self._handles.pop(i, None)
        self._recheck[i] = 0.0

    def compute_round(self, step: int, *parts: tuple[int, Tensors]) -> Any:
        """Bulk-synchronous round ``step``: the update on the parameters the driver pulled
        (``parts``: each shard's ``pull`` result, passed by reference), split per shard
        so each part goes straight to its shard's ``apply_round``."""
        t0 = time.perf_counter()
        params = self.layout.assemble([p[1] for p in parts])
        update = self.worker.compute(params, step)
        self.busy += time.perf_counter() - t0
        self.step = step + 1
        self.pushes += 1
        out = self.layout.split_partial(update)
        return out[0] if len(out) == 1 else out  # one return value per shard

    def rewind(self, step: int) -> None:
        """A rollback to a checkpoint of ``step``: go back to that data position (the
        pushes keep fresh sequence numbers, so none is taken for a duplicate)."""
        self.step = step

    def stop(self) -> None:
        self._stop.set()

    def progress(self) -> dict[str, Any]:
        return {"step": self.step, "busy": self.busy, "idle": self.idle, "comm": self.comm,
                "pushes": self.pushes, "acked": dict(self.acked),
                "buffered": self.buffered, "backlog": sum(len(b) for b in self._backlogs)}

    # -- shard lookup -----------------------------------------------------------
    def _resolve(self, i: int) -> tuple[Any, Any] | None:
        """(write replica, read replica) of shard ``i``: cached until a call to it fails
        (then the registry says who serves the shard now)."""
        cached = self._handles.get(i)
        if cached:
            return cached[1], cached[2]
        # A shard known to be down is looked up again at most every RECHECK seconds,
        # so a stateless worker spends the outage computing, not asking the registry.
        now = time.perf_counter()
        if now < self._recheck.get(i, 0.0):
            return None
        self._recheck[i] = now + RECHECK
        epoch, members = ray.get(self.registry.members.remote(f"shard{i}"))
        if not members:
            return None
        try:
            write = ray.get_actor(members[0])
            read = ray.get_actor(members[-1] if self.s["read_from"] == "tail" else members[0])
        except ValueError:  # a replica named in the registry died before we got it
            return None
        self._handles[i] = (epoch, write, read)
        return write, read

    def _pull(self) -> Tensors | None:
        handles = [self._resolve(i) for i in range(self.layout.num_shards)]
        if any(h is None for h in handles):
            return None
        refs = [h[1].pull.remote() for h in handles]  # type: ignore[index]
        parts: list[Tensors] = []
        for i, ref in enumerate(refs):
            try:
                parts.append(ray.get(ref)[1])
            except ray.exceptions.RayError:
                self._handles.pop(i, None)
        return self.layout.assemble(parts) if len(parts) == len(refs) else None

    # -- the loop ---------------------------------------------------------------
    def run(self, max_steps: int) -> dict[str, Any]:
        buffer = self.s["outage"] == "buffer"
        while not self._stop.is_set() and self.step < max_steps:
            t0 = time.perf_counter()
            params = self._pull()
            if params is not None:
                self._params = params
            elif not buffer or self._params is None:
                self.idle += self._pause(t0)
                continue
            t1 = time.perf_counter()
            update = self.worker.compute(self._params, self.step)
            t2 = time.perf_counter()
            self.busy += t2 - t1
            self.step += 1
            self.seq += 1
            idle0 = self.idle
            self._push_all(update, stale=params is None)
            self.comm += (t1 - t0) + (time.perf_counter() - t2) - (self.idle - idle0)
        return self.progress()

    def _pause(self, t0: float) -> float:
        time.sleep(0.005)
        return time.perf_counter() - t0

    def _push_all(self, update: Tensors, stale: bool) -> None:
        slices = self.layout.split_partial(update)
        pending = {}
        for i, part in enumerate(slices):
            h = self._resolve(i)
            if h is not None and not (stale and self.s["outage"] == "buffer" and len(self._backlogs[i])):
                self._flush(i, h[0])
                pending[i] = (h[0], h[0].push.remote(self.worker.worker_id, self.seq, part,
                                                      self.s["scale"]))
            else:
                pending[i] = (None, None)
        for i, (_handle, ref) in pending.items():
            ok = False
            if ref is not None:
                try:
                    ray.get(ref)
                    ok = True
                except ray.exceptions.RayError:
                    self._handles.pop(i, None)
            if ok:
                self._ack(i, self.seq)
            elif self.s["outage"] == "buffer":
                self._backlogs[i].add(slices[i], 0, _add)
                self.buffered += 1
            else:
                self._retry(i, slices[i])

    def _ack(self, shard: int, seq: int) -> None:
        self.pushes += 1
        self.acked[shard] = max(self.acked.get(shard, -1), seq)

    def _retry(self, i: int, part: Tensors) -> None:
        """Wait for shard ``i`` to come back, then push the same sequence number."""
        t0 = time.perf_counter()
        try:
            self._retry_loop(i, part)
        finally:
            self.idle += time.perf_counter() - t0

    def _retry_loop(self, i: int, part: Tensors) -> None:
        while not self._stop.is_set():
            h = self._resolve(i)
            if h is not None:
                try:
                    ray.get(h[0].push.remote(self.worker.worker_id, self.seq, part,
                                             self.s["scale"]))
                    self._ack(i, self.seq)
                    return
                except ray.exceptions.RayError:
                    self._handles.pop(i, None)
            time.sleep(0.005)

    def _flush(self, i: int, handle: Any) -> None:
        """Apply the backlog for shard ``i`` (oldest first) with the merge rule."""
        items = self._backlogs[i].drain()
        if not items:
            return
        if self.s["merge_rule"] == "mean":
            # One step of the usual size: push the sum once, scaled by 1/count (many
            # tiny steps would cost one round trip each and, under Adam, not be equal).
            total = {n: v.clone() for n, v in items[0][0].items()}
            for update, _, _ in items[1:]:
                total = _add(total, update)
            items = [(total, 0, sum(c for _, _, c in items))]
        plan = merge_plan([c for _, _, c in items], [len(items) - k - 1 for k in range(len(items))],
                          self.s["merge_rule"], self.s["merge_threshold"])
        for d in plan:
            update, _, count = items[d.index]
            self.seq += 1
            try:
                ray.get(handle.push.remote(self.worker.worker_id, self.seq, update,
                                           self.s["scale"] * d.scale))
                self._ack(i, self.seq)
            except ray.exceptions.RayError:
                self._backlogs[i].add(update, 0, _add, count)
