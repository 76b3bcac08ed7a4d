"""A parameter-server worker hosted in a Ray actor, running at its own pace.

Each step: pull every shard (from the replica that serves reads), compute the
workload's update with the same :class:`~trainthrough.ps.worker.Worker` code as
every engine, push each shard its slice, and wait for the acknowledgements.

When a shard is unreachable the outage policy decides: ``wait`` (look up the
shard's new replica in the registry, retry the same push — its sequence number
makes a retry safe) or ``buffer`` (the stateless PS: keep computing on the last
parameters held, queue the slices in bounded backlogs, and apply them with the
merge rule when the shard is back).

During a ``buffer`` outage nothing waits on a round trip: every step's update is
summed into what goes to the backlogs at the next contact, live shards included
(their updates were computed on the same stale parameters as the lost shard's, so the
same merge rule applies), and the worker
contacts the shards (flushes the live ones' backlogs, refreshes their parameters,
asks whether the lost one is back) only once it has computed ``CONTACT_RATIO``
times as long as its last contact took: a small model's step is far shorter than a
round trip, and contacting the shards at every step would leave its workers waiting
through most of the outage.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import ray
import torch

from trainthrough.engines.ray.actors.reports import Progress, Pulled, WorkerSettings
from trainthrough.engines.ray.actors.routes import RECHECK, ShardRoutes
from trainthrough.ft.outage import Backlog, merge_plan
from trainthrough.ps.layout import Layout
from trainthrough.ps.worker import Worker
from trainthrough.workloads import make_workload

Tensors = dict[str, torch.Tensor]
# Compute time between two contacts during an outage, as a multiple of the last
# contact's duration: contacts then take at most 1/(1 + 19) = 5% of the outage, which
# leaves room for what no worker can avoid (the call that found the shard dead waits
# for Ray's death notice: 20-100 ms here). A shard's return is announced, and acted
# on at the next step.
CONTACT_RATIO = 19.0
# ...and at least this much compute between contacts: a contact that finds no shard to
# ask costs ~0.1 ms, and each one adds a backlog entry (256 entries: >= 5 s of outage).
MIN_CONTACT_GAP = 0.02


def _add(a: Tensors, b: Tensors) -> Tensors:
    return {n: a[n] + b[n] if n in b else a[n] for n in a} | {n: b[n] for n in b if n not in a}


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)  # type: ignore[call-overload]
class WorkerActor:
    """One worker; ``run`` loops until ``stop``; ``progress`` can be called meanwhile."""

    def __init__(self, worker_id: int, workload: str, options: dict[str, Any], seed: int,
                 num_workers: int, layout: Layout, registry: Any, settings: WorkerSettings,
                 start_step: int = 0, incarnation: int = 0) -> None:
        torch.set_num_threads(1)
        self._dead = threading.Event()  # released (set) only when a run gives it back
        self._looping = threading.Event()  # set while ``run`` loops
        self.reset(worker_id, workload, options, seed, num_workers, layout, registry,
                   settings, start_step, incarnation)

    def reset(self, worker_id: int, workload: str, options: dict[str, Any], seed: int,
              num_workers: int, layout: Layout, registry: Any, settings: WorkerSettings,
              start_step: int = 0, incarnation: int = 0) -> None:
        """Everything a run keeps, built fresh (the workload too: its data, partition
        and worker state): what the constructor does, so a pooled actor
        (engines/ray/driver/pool.py) starts a run as a new one would."""
        wl = make_workload(workload, seed=seed, **options)
        self.layout = layout
        self.worker = Worker(worker_id, wl, wl.partition(num_workers)[worker_id], seed)
        self.routes = ShardRoutes(registry, settings["read_from"])
        self.s = settings
        self.step = start_step
        # Sequence numbers strictly above any an earlier incarnation of this worker used
        # (each does far fewer than 2**40 pushes): a replacement's pushes are never
        # mistaken for duplicates of its predecessor's and dropped.
        self.seq = incarnation << 40
        self._stop = threading.Event()
        self._params: Tensors | None = None
        self._versions: tuple[int, ...] = ()
        self._backlogs = [Backlog[Tensors](settings.get("backlog", 256))
                          for _ in layout.shards]
        # busy: computing; idle: waiting for a shard that is down; comm: the rest
        # (pulls and pushes that went through).
        self.busy = self.idle = self.comm = 0.0
        # The outage as this worker lives it: from its first failed call to a shard
        # until every shard answers again (buffer mode); its compute time inside.
        self.outage_busy = self._outage_done = 0.0
        self._outage_since: float | None = None
        self._since_contact = self._contact_cost = 0.0
        self._contact_due = False
        # Updates computed since the last contact, summed in place (one add per tensor
        # and step: a small model's step is ~0.2 ms, so per-step bookkeeping counts).
        self._acc: Tensors | None = None
        self._acc_count = 0
        self.pushes = self.duplicates_skipped = self.buffered = 0
        self.acked: dict[int, int] = {}  # shard -> highest sequence number acknowledged
        self.acked_pushes: dict[int, int] = {}  # shard -> pushes acknowledged
        self.worker.start(wl.init_params(torch.Generator().manual_seed(seed)), incarnation)

    def whoami(self) -> tuple[int, str]:
        """(pid, node id): the driver signals this process only if it is on its node."""
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def watch(self) -> None:
        """Returns only when a run releases the actor (``release``): while it serves,
        the caller gets ActorDiedError on its death and nothing else."""
        self._dead.wait()

    def release(self) -> bool:
        """The run is over: stop the loop and let the pending ``watch`` return, so the
        actor can wait in the pool for ``reset``. False: the loop did not stop."""
        self._stop.set()
        deadline = time.perf_counter() + 5.0
        while self._looping.is_set() and time.perf_counter() < deadline:
            time.sleep(0.01)
        if self._looping.is_set():
            return False
        dead, self._dead = self._dead, threading.Event()
        dead.set()  # the previous run's ``watch`` returns; the next one waits anew
        return True

    def shard_changed(self, i: int) -> None:
        """The driver says who serves shard ``i`` changed: look it up on next use."""
        self.routes.changed(i)
        self._contact_due = True  # an outage ends as soon as the shard is back

    def compute_round(self, step: int, *parts: Pulled) -> Any:
        """Bulk-synchronous round ``step``: the update on the parameters the driver pulled
        (``parts``: each shard's ``pull`` result, passed by reference), split per shard
        so each part goes straight to its shard's ``apply_round``."""
        t0 = time.perf_counter()
        params = self.layout.assemble([p.params for p in parts])
        update = self.worker.compute(params, step)
        self.busy += time.perf_counter() - t0
        self.step = step + 1
        self.pushes += 1
        out = self.layout.split_partial(update)
        if self.s.get("keep_copies"):
            # Kept for worker-copy recovery: the pull (fresh tensors from the shards,
            # never changed here) and the push made from it.
            self.worker.keep(params, tuple(p.version for p in parts))
            self.worker.keep_push(out)
        return out[0] if len(out) == 1 else out  # one return value per shard

    def copy_version(self, shard: int) -> int | None:
        """The version of shard ``shard`` in this worker's copy (None: it holds none,
        e.g. a replacement that has not pulled yet)."""
        c = self.worker.copy
        return None if c is None else c.versions[shard]

    def copy_rows(self, shard: int, rows: bool, push: bool
                  ) -> tuple[int, int, Tensors, Tensors | None] | None:
        """Worker-copy recovery asks for shard ``shard``'s slices only: (worker id, the
        shard's version at the pull, the rows if ``rows``, the push slice made from them
        if ``push`` and kept); None when this worker holds no copy."""
        c = self.worker.copy
        if c is None:
            return None
        values = ({n: v.clone() for n, v in self.layout.split(c.params)[shard].items()}
                  if rows else {})
        pushed = ({n: v.clone() for n, v in c.pushed[shard].items()}
                  if push and c.pushed is not None else None)
        return self.worker.worker_id, c.versions[shard], values, pushed

    def rewind(self, step: int) -> None:
        """A rollback to a checkpoint of ``step``: go back to that data position (the
        pushes keep fresh sequence numbers, so none is taken for a duplicate)."""
        self.step = step

    def stop(self) -> None:
        self._stop.set()

    def progress(self) -> Progress:
        """Counters; ``outage``: seconds spent with a shard unreachable (waiting, or
        buffering), ``outage_busy``: the compute seconds among them."""
        ongoing = 0.0 if self._outage_since is None else time.perf_counter() - self._outage_since
        return Progress(step=self.step, busy=self.busy, idle=self.idle, comm=self.comm,
                        pushes=self.pushes, acked=dict(self.acked),
                        acked_pushes=dict(self.acked_pushes), buffered=self.buffered,
                        backlog=sum(len(b) for b in self._backlogs),
                        outage=self.idle + self._outage_done + ongoing,
                        outage_busy=self.outage_busy)

    # -- shard calls ------------------------------------------------------------
    def _pull(self) -> Tensors | None:
        """Every shard's parameters, assembled; None if any shard did not answer."""
        parts = self._pull_parts(all_or_none=True)
        if any(p is None for p in parts):
            return None
        return self.layout.assemble(parts)  # type: ignore[arg-type]

    def _pull_parts(self, all_or_none: bool = False) -> list[Tensors | None]:
        """Each shard's parameters (None for a shard that is down or did not answer);
        ``all_or_none``: ask no shard if one is known to be down."""
        handles = [self.routes.get(i) for i in range(self.layout.num_shards)]
        if all_or_none and any(h is None for h in handles):
            return [None] * len(handles)
        refs = [h.read.pull.remote() if h is not None else None for h in handles]
        parts: list[Tensors | None] = []
        versions: list[int] = []
        for i, ref in enumerate(refs):
            try:
                version, part = ray.get(ref) if ref is not None else (-1, None)
            except ray.exceptions.RayError:
                self.routes.forget(i)
                version, part = -1, None
            parts.append(part)
            versions.append(version)
        self._versions = tuple(versions)  # each shard's version at this pull
        return parts

    # -- the loop ---------------------------------------------------------------
    def run(self, max_steps: int) -> Progress:
        self._looping.set()
        try:
            self._loop(max_steps)
        finally:
            self._looping.clear()
        return self.progress()

    def _loop(self, max_steps: int) -> None:
        buffer = self.s["outage"] == "buffer"
        while not self._stop.is_set() and self.step < max_steps:
            if self._outage_since is not None:
                self._outage_step()
                continue
            t0 = time.perf_counter()
            params = self._pull()
            if params is None:
                if buffer and self._params is not None:
                    self._enter_outage(t0)
                else:
                    self.idle += self._pause(t0)
                continue
            self._params = params
            if self.s.get("keep_copies"):  # held anyway as _params: no extra memory
                self.worker.keep(params, self._versions)
            t1 = time.perf_counter()
            update = self.worker.compute(params, self.step)
            t2 = time.perf_counter()
            self.busy += t2 - t1
            self.step += 1
            self.seq += 1
            idle0 = self.idle
            self._push_all(update, t2)
            self.comm += (t1 - t0) + (time.perf_counter() - t2) - (self.idle - idle0)

    def _pause(self, t0: float) -> float:
        time.sleep(0.005)
        return time.perf_counter() - t0

    def _push_all(self, update: Tensors, t0: float) -> None:
        """Push each shard its slice (sent together, then awaited). A failed push is
        retried (``wait``) or buffered, which starts an outage that began at ``t0``."""
        slices = self.layout.split_partial(update)
        pending = {}
        for i, part in enumerate(slices):
            h = self.routes.get(i)
            pending[i] = None if h is None else h.write.push.remote(
                self.worker.worker_id, self.seq, part, self.s["scale"])
        for i, ref in pending.items():
            ok = False
            if ref is not None:
                try:
                    ray.get(ref)
                    ok = True
                except ray.exceptions.RayError:
                    self.routes.forget(i)
            if ok:
                self._ack(i, self.seq)
            elif self.s["outage"] == "buffer":
                self._backlogs[i].add(slices[i], 0, _add)
                self.buffered += 1
                if self._outage_since is None:
                    self._enter_outage(t0)
            else:
                self._retry(i, slices[i])

    # -- a stateless outage -------------------------------------------------------
    def _enter_outage(self, t0: float) -> None:
        """A shard stopped answering at ``t0``: compute on, contact the shards later."""
        self._outage_since = t0
        self._since_contact = 0.0
        # The failed attempt is the first contact: the next one waits for 9x its cost.
        self._contact_cost = time.perf_counter() - t0
        self._contact_due = False

    def _outage_step(self) -> None:
        """One step on the parameters held; every slice to its shard's backlog."""
        assert self._params is not None  # an outage starts only once parameters are held
        t1 = time.perf_counter()
        update = self.worker.compute(self._params, self.step)
        t2 = time.perf_counter()
        self.busy += t2 - t1
        self.outage_busy += t2 - t1
        self._since_contact += t2 - t1
        self.step += 1
        acc = self._acc
        if acc is None or acc.keys() != update.keys():
            self._stash()  # (an update touching other parameters starts a new sum)
            self._acc = {n: v.clone() for n, v in update.items()}
        else:
            torch._foreach_add_([acc[n] for n in update], list(update.values()))
        self._acc_count += 1
        self.buffered += self.layout.num_shards
        # Never longer than RECHECK between contacts: a slow contact on a loaded machine
        # must not leave a returned shard unasked for long if its announcement is lost.
        gap = min(RECHECK, max(MIN_CONTACT_GAP, CONTACT_RATIO * self._contact_cost))
        if self._contact_due or self._since_contact >= gap:
            self._contact()
        self.comm += time.perf_counter() - t2

    def _contact(self) -> None:
        """Flush every reachable shard's backlog and pull what answers: the outage is
        over if every shard did; else the live shards' parameters are refreshed."""
        t0 = time.perf_counter()
        self._contact_due = False
        self._stash()
        flushed = True
        for i in range(self.layout.num_shards):
            h = self.routes.get(i)
            flushed = h is not None and self._flush(i, h.write) and flushed
        parts = self._pull_parts()
        held = self.layout.split(self._params)  # type: ignore[arg-type]
        self._params = self.layout.assemble([p if p is not None else held[i]
                                             for i, p in enumerate(parts)])
        now = time.perf_counter()
        if flushed and all(p is not None for p in parts):
            # The outage ended when this contact found every shard serving: handing
            # over the backlog is the recovery's work, after the outage.
            self._outage_done += t0 - self._outage_since  # type: ignore[operator]
            self._outage_since = None
        self._contact_cost, self._since_contact = now - t0, 0.0

    def _stash(self) -> None:
        """The sum of the steps since the last contact becomes one backlog entry per
        shard, counting those steps (every merge rule sees each raw update: ``mean``
        and ``scaled`` divide by the count; all were computed on the same parameters,
        so none is staler than another)."""
        if self._acc is None:
            return
        for i, part in enumerate(self.layout.split_partial(self._acc)):
            if part:
                self._backlogs[i].add(part, 0, _add, self._acc_count)
        self._acc, self._acc_count = None, 0

    def _ack(self, shard: int, seq: int) -> None:
        self.pushes += 1
        self.acked[shard] = max(self.acked.get(shard, -1), seq)
        self.acked_pushes[shard] = self.acked_pushes.get(shard, 0) + 1

    def _retry(self, i: int, part: Tensors) -> None:
        """Wait for shard ``i`` to come back, then push the same sequence number."""
        t0 = time.perf_counter()
        try:
            self._retry_loop(i, part)
        finally:
            self.idle += time.perf_counter() - t0

    def _retry_loop(self, i: int, part: Tensors) -> None:
        while not self._stop.is_set():
            h = self.routes.get(i)
            if h is not None:
                try:
                    ray.get(h.write.push.remote(self.worker.worker_id, self.seq, part,
                                             self.s["scale"]))
                    self._ack(i, self.seq)
                    return
                except ray.exceptions.RayError:
                    self.routes.forget(i)
            time.sleep(0.005)

    def _flush(self, i: int, handle: Any) -> bool:
        """Apply the backlog for shard ``i`` (oldest first) with the merge rule.

        Returns:
            False if a push failed (what it carried is back in the backlog).
        """
        items = self._backlogs[i].drain()
        if not items:
            return True
        if self.s["merge_rule"] == "mean":
            # One step of the usual size: push the mean gradient once, at the usual
            # scale (many tiny steps would cost one round trip each). Not the sum with
            # the step scaled by 1/count: Adam's moments would take in a gradient
            # count times too large (m stale for tens of steps, v inflated for
            # thousands: measured, cnn accuracy 0.89 -> 0.55 right after the recovery).
            count = sum(c for _, _, c in items)
            first, _, _ = items[0]
            total = {n: v.clone() for n, v in first.items()}
            for update, _, _ in items[1:]:
                total = _add(total, update)
            for v in total.values():
                v.div_(count)
            items = [(total, 0, 1)]
        plan = merge_plan([c for _, _, c in items], [len(items) - k - 1 for k in range(len(items))],
                          self.s["merge_rule"], self.s["merge_threshold"])
        ok = True
        for d in plan:
            update, _, count = items[d.index]
            self.seq += 1
            try:
                ray.get(handle.push.remote(self.worker.worker_id, self.seq, update,
                                           self.s["scale"] * d.scale))
                self._ack(i, self.seq)
            except ray.exceptions.RayError:
                self._backlogs[i].add(update, 0, _add, count)
                self.routes.forget(i)
                ok = False
        return ok
