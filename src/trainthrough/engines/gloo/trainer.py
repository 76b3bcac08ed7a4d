"""A rank process's training state, hosting the shared step on a real gloo group.

The step is :func:`trainthrough.dp.step.train_step`, the one ``sim`` runs, with the
gloo group as its collective and the rank's own :class:`~.faults.Injector`: the
same global batch from the same cursor, the same micro-batches and their seeds, the
same buckets and the same optimizer, so a failure-free run matches ``sim`` to the
last bits of float summation order (each rank sums its micro-batches, gloo sums the
ranks). Call order: :meth:`Trainer.restore` (restarted processes only), then per
attempt :meth:`Trainer.recover` with the attempt's plan and :meth:`Trainer.train`
until it returns; :meth:`Trainer.finish` once at the end.

A step is committed only once its vote succeeded: until then it is "in flight"
(:class:`~trainthrough.dp.step.InFlight`), and what it got through is what the
shared repair routines (:mod:`trainthrough.dp.repair`) work with. The first member
measures each recovery against the failure-free replica (:mod:`trainthrough.dp.reference`,
as ``sim`` does) and saves checkpoints (:class:`~.checkpoints.RankSaves`).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import safetensors.torch
import torch
import torch.distributed as dist

from trainthrough.config import RunConfig
from trainthrough.dp.allreduce import make_buckets
from trainthrough.dp.batching import Cursor, SampleStream, micro_size, plan_batch
from trainthrough.dp.collective import run_blocking
from trainthrough.dp.rank import Rank, Tensors
from trainthrough.dp.reference import before_step, failure_free
from trainthrough.dp.repair import complete, share_state, undo
from trainthrough.dp.step import InFlight, StepSpec, train_step
from trainthrough.engines.gloo.checkpoints import RankSaves
from trainthrough.engines.gloo.faults import Injector
from trainthrough.engines.gloo.group import Group
from trainthrough.engines.gloo.protocol import Plan, post
from trainthrough.ft.dp_policies import ElasticPolicy, group_recovery_policy
from trainthrough.ft.perturbation import perturbation
from trainthrough.ft.strategy import resolve
from trainthrough.workloads import make_workload


class Trainer:
    """One replica and the run's counters, as this process sees them."""

    def __init__(self, cfg: RunConfig, slot: int, store: dist.Store,
                 orders: list[dict[str, object]], t0: float, checkpoint_url: str,
                 joining: bool = False) -> None:
        self.cfg, self.slot, self.store = cfg, slot, store
        self.inj = Injector(orders, store, t0, logical=lambda: self.logical)
        w = make_workload(cfg.workload, seed=cfg.seed, **cfg.workload_options)
        spec = w.default_optimizer if cfg.lr is None else replace(w.default_optimizer, lr=cfg.lr)
        x0 = w.init_params(torch.Generator().manual_seed(cfg.seed))
        self.replica = Rank(slot, w, spec, x0, cfg.seed)
        self.stream = SampleStream(w.sample_count() or 0, cfg.seed)
        self.micro = micro_size(w.batch_size)
        self.elastic = ElasticPolicy(cfg.elastic, cfg.ranks, w.batch_size)
        strategy = resolve(cfg.strategy)
        self.spec = StepSpec(make_buckets(self.replica.layout.numel, cfg.allreduce_buckets),
                             w.aggregate == "mean",
                             group_recovery_policy(strategy.recovery).needs_step_snapshot)
        self.saves = RankSaves(cfg, strategy, checkpoint_url, self.replica,
                               lambda event: post(store, event))
        self.cursor, self.logical, self.executed = Cursor(), 0, 0
        self.ctl_seen = 0.0  # the last control counter acted on (same on every member)
        self.applied = 0  # replica updates of committed steps (first member's count)
        self.flight: InFlight | None = None
        self.joining = joining  # a replacement: holds no state until a peer shares it
        self.resumed = False  # a recovery waits for its first committed step

    # -- around failures ----------------------------------------------------------
    def restore(self, step: int | None) -> None:
        """Checkpoint-restart: load exactly the checkpoint ``step`` the controller chose
        for every rank (None: start over from x0)."""
        if step is not None:
            tensors, self.cursor = self.saves.load(step)
            self.replica.load(tensors)
            self.logical = step

    def recover(self, g: Group, plan: Plan) -> None:
        """Carry out the first part of attempt ``plan.n`` on the formed group."""
        fl, self.flight = self.flight, None
        # What the failure-free group would hold once this recovery is done.
        reference = before_step(self.replica, fl)
        if plan.action == "join":
            self._share_state(g)
        elif plan.action == "rollback":
            if plan.undo and fl is not None:
                undo(self.replica, fl)
        elif plan.action == "lossy" and plan.complete and fl is not None:
            full = run_blocking(failure_free(self.replica, fl, g, self.spec, plan.buckets_done))
            dropped = run_blocking(complete(self.replica, fl, g, self.spec, plan.buckets_done))
            reference = full if full is not None else self.replica.params
            if g.rank == 0 and dropped:
                post(self.store, {"type": "completed", "micro_dropped": dropped,
                                  "samples_dropped": dropped * self.micro})
            self._commit(g, fl)
        if plan.uncount:
            self.executed -= 1
        if plan.action not in ("start", "join"):
            self.resumed = True
        if plan.action == "start" and self.executed == 0 and g.rank == 0:
            self.post_params()  # the initial evaluation, as sim does
        if g.rank == 0 and plan.action != "start":
            event = {"type": "reformed", "n": plan.n, "ranks": g.members, "action": plan.action}
            if plan.action in ("rollback", "lossy"):
                event["perturbation"] = perturbation(reference, self.replica.params)[0]
            post(self.store, event)

    def post_before(self) -> None:
        """The group restarts: send the replica as it was before the interrupted step,
        the restart's reference (nothing if this rank applied it and kept no copy)."""
        before = before_step(self.replica, self.flight)
        if before is not None:
            post(self.store, {"type": "before"}, _blob(before))

    def _share_state(self, g: Group) -> None:
        """A replacement joins: every member takes a holder's replica and counters."""
        c = self.cursor
        mine = [self.executed, self.logical, c.epoch, c.offset, int(self.ctl_seen), self.applied]
        m = run_blocking(share_state(self.replica, g, mine, holder=not self.joining))
        self.executed, self.logical, self.cursor = m[0], m[1], Cursor(m[2], m[3])
        self.ctl_seen, self.applied, self.joining = float(m[4]), m[5], False

    # -- the step -----------------------------------------------------------------
    def train(self, g: Group) -> str:
        """Step until the run ends (``done``) or the controller asks for a change (``ctl``)."""
        while self.executed < (self.cfg.max_iterations or 0):
            ctl = self._step(g)
            if ctl != self.ctl_seen:
                self.ctl_seen = ctl
                return "ctl"
        return "done"

    def _step(self, g: Group) -> float:
        # Failure triggers count attempts made *before* this one, as sim does.
        before = self.executed
        self.executed += 1
        d = self.elastic.decide(g.size)
        batch = plan_batch(self.stream, self.cursor, d.global_batch, d.lr_scale, g.members,
                           self.micro)
        fl = self.flight = InFlight.begin(batch, self.logical, self.replica.layout.numel)

        def ballot() -> float:  # the first member shares the controller's counter
            return float(self.store.add("ctl", 0)) if g.rank == 0 else 0.0

        ctl = run_blocking(train_step(self.replica, fl, g, self.inj, self.spec, before, ballot))
        self._commit(g, fl)
        return ctl

    def _commit(self, g: Group, fl: InFlight) -> None:
        self.cursor, self.flight = fl.batch.next_cursor, None
        self.logical += 1
        self.applied += g.size
        if g.rank != 0:
            return
        if self.resumed:
            post(self.store, {"type": "resumed", "iteration": self.executed})
        self.resumed = False
        self.saves.after_commit(self.replica, self.logical, self.cursor, g.members)
        if self.executed % (self.cfg.eval_every or 1) == 0:
            self.post_params()

    def post_params(self, final: bool = False) -> None:
        """Send the parameters to the controller, which evaluates them."""
        post(self.store, {"type": "params", "iteration": self.executed, "logical": self.logical,
                          "final": final, "applied": self.applied}, _blob(self.replica.params))

    def finish(self) -> dict[str, Any]:
        """What every rank reports at the end: counters and a hash of its replica."""
        h = hashlib.sha256()
        for n in sorted(self.replica.params):
            h.update(self.replica.params[n].numpy().tobytes())
        return {"slot": self.slot, "executed": self.executed, "logical": self.logical,
                "params_sha256": h.hexdigest()}


def _blob(params: Tensors) -> bytes:
    """Parameters as safetensors bytes (nothing crosses processes pickled)."""
    return safetensors.torch.save({n: v.contiguous() for n, v in params.items()})
