"""A rank process's training state, hosting the shared step on a real gloo group.

The step is :func:`trainthrough.dp.step.train_step`, the one ``sim`` runs, with the
gloo group as its collective and the rank's own :class:`~.faults.Injector`: the
same global batch from the same cursor, the same micro-batches and their seeds, the
same buckets and the same optimizer, so a failure-free run matches ``sim`` to the
last bits of float summation order (each rank sums its micro-batches, gloo sums the
ranks). Call order: :meth:`Trainer.restore` (restarted processes only), then per
attempt :meth:`Trainer.recover` with the attempt's plan and :meth:`Trainer.train`
until it returns; :meth:`Trainer.finish` once at the end.

A step is committed only once its last collective, which carries the vote,
completed: until then it is "in flight" (:class:`~trainthrough.dp.step.InFlight`),
and what it got through is what the shared repair routines
(:mod:`trainthrough.dp.repair`) work with. The first member
measures each recovery against the failure-free replica (:mod:`trainthrough.dp.reference`,
as ``sim`` does) and saves checkpoints (:class:`~.checkpoints.RankSaves`).
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from trainthrough.config import RunConfig
from trainthrough.dp.allreduce import plan_buckets
from trainthrough.dp.batching import Cursor, MicroBatch, SampleStream, micro_size, plan_batch
from trainthrough.dp.collective import run_blocking
from trainthrough.dp.rank import Rank, Replica, Tensors, live_params
from trainthrough.dp.reference import failure_free
from trainthrough.dp.relaxed import RelaxedReplica, SyncSpec, inner_step, outer_step
from trainthrough.dp.repair import complete, share_state
from trainthrough.dp.step import InFlight, StepSpec, train_step
from trainthrough.engines.evaluation import EvalPolicy
from trainthrough.engines.gloo.checkpoints import RankSaves
from trainthrough.engines.gloo.evals import RankEvals, Scorer
from trainthrough.engines.gloo.faults import Injector
from trainthrough.engines.gloo.group import Group
from trainthrough.engines.gloo.messages import (
    Before,
    Reformed,
    Resumed,
    StepCompleted,
)
from trainthrough.engines.gloo.protocol import Doorbell, Plan, post
from trainthrough.errors import UserError
from trainthrough.ft.dp_policies import ElasticPolicy
from trainthrough.ft.perturbation import perturbation
from trainthrough.ft.strategy import resolve
from trainthrough.workloads import make_workload
from trainthrough.workloads.base import Evaluation


class Trainer:
    """One replica and the run's counters, as this process sees them.

    The replica is a trainthrough workload's :class:`~trainthrough.dp.rank.Rank`
    (:meth:`for_workload`) or the user's own model
    (:class:`~trainthrough.dp.module_replica.ModuleReplica`, :mod:`trainthrough.loop`);
    ``samples`` is the training set's size, ``batch_size`` the per-rank batch.
    ``scorer``: what evaluates any parameters (the workload: the first member scores
    its replica and its look-back copies in place); None for a user's loop, whose
    :attr:`evaluate_here` scores the live model. ``x0``: the initial parameters, made
    when needed (a restart from x0 measures its perturbation against them).
    """

    def __init__(self, cfg: RunConfig, slot: int, store: dist.TCPStore,
                 orders: list[dict[str, object]], t0: float, checkpoint_url: str,
                 replica: Replica, samples: int, batch_size: int, checkpoint_every: int,
                 mean: bool = True, joining: bool = False, scorer: Scorer | None = None,
                 x0: Callable[[], Tensors] | None = None) -> None:
        self.cfg, self.slot, self.store = cfg, slot, store
        self.inj = Injector(orders, store, t0, logical=lambda: self.logical,
                            local_steps=self._local_steps)
        strategy = resolve(cfg.strategy)
        # Relaxed sync: the replica carries the outer state (dp/relaxed.py); the outer
        # steps due after the last inner step, run (again, after a loss) before the next.
        self.sync = SyncSpec.of(cfg, strategy.sync)
        self.replica: Replica = RelaxedReplica(replica, self.sync) if self.sync else replica
        self.pending_outer: list[int] = []
        self.outer_steps = 0  # outer steps this process completed
        self.stream = SampleStream(samples, cfg.seed)
        self.micro = micro_size(batch_size, cfg.micro_batches)
        self.elastic = ElasticPolicy(cfg.elastic, cfg.ranks, batch_size)
        numel = replica.layout.numel
        if cfg.allreduce_buckets is not None and not 1 <= cfg.allreduce_buckets <= numel:
            # A user's model is known here only.
            raise UserError(f"allreduce_buckets (--allreduce-buckets) must be between 1 and "
                            f"the {numel} values of the model's gradient "
                            f"(got {cfg.allreduce_buckets})")
        self.spec = StepSpec(plan_buckets(numel, cfg.allreduce_buckets), mean)
        self.saves = RankSaves(cfg, strategy, checkpoint_url, self.replica, checkpoint_every,
                               lambda saved: post(store, saved))
        self.cursor, self.logical, self.executed = Cursor(), 0, 0
        self.limit_epochs: int | None = None  # a user's loop ends after so many epochs
        self.last_share: list[MicroBatch] = []  # this rank's part of the last commit
        self.ctl_seen = 0.0  # the last control counter acted on (same on every member)
        self.applied = 0  # replica updates of committed steps (first member's count)
        self.flight: InFlight | None = None
        self.joining = joining  # a replacement: holds no state until a peer shares it
        self.resumed = False  # a recovery waits for its first committed step
        self.history: list[tuple[int, int, list[int]]] = []  # (logical, attempt, members)
        self.attempt = -1  # the group incarnation this process is in
        self.scorer, self.x0 = scorer, x0
        # A user's loop: its own evaluation of its live model, on the first member.
        self.evaluate_here: Callable[[], Evaluation] | None = None
        # A user's loop: called with (the epoch of the batch, committed steps) before
        # each step's first micro-batch, on every member (its epoch and eval callbacks).
        self.before_step: Callable[[int, int], None] | None = None
        self._bell: Doorbell | None = None  # the controller's requests, once we lead
        # As the first member. The controller resolved eval_every and the target into
        # the config every rank gets (controller.run).
        self.evals = RankEvals(EvalPolicy(cfg.eval_every or 1, keep_bytes=cfg.lookback_bytes),
                               store, scorer,
                               cfg.target if cfg.target is not None else float("nan"))

    @classmethod
    def for_workload(cls, cfg: RunConfig, slot: int, store: dist.TCPStore,
                     orders: list[dict[str, object]], t0: float, checkpoint_url: str,
                     joining: bool = False) -> Trainer:
        """A trainer of the run's trainthrough workload (``cfg.workload``)."""
        w = make_workload(cfg.workload, seed=cfg.seed, **cfg.workload_options)
        spec = w.default_optimizer if cfg.lr is None else replace(w.default_optimizer, lr=cfg.lr)
        def x0() -> Tensors:
            return w.init_params(torch.Generator().manual_seed(cfg.seed))

        return cls(cfg, slot, store, orders, t0, checkpoint_url,
                   Rank(slot, w, spec, x0(), cfg.seed), w.sample_count() or 0, w.batch_size,
                   cfg.checkpoint_every or w.default_checkpoint_every,
                   mean=w.aggregate == "mean", joining=joining, scorer=w, x0=x0)

    # -- around failures ----------------------------------------------------------
    def restore(self, step: int | None) -> None:
        """Checkpoint-restart: load exactly the checkpoint ``step`` the controller chose
        for every rank (None: start over from x0)."""
        if step is not None:
            tensors, self.cursor = self.saves.load(step)
            self.replica.load(tensors, own=True)
            self.logical = step

    def recover(self, g: Group, plan: Plan) -> None:
        """Carry out the first part of attempt ``plan.n`` on the formed group."""
        fl, self.flight = self.flight, None
        self.attempt = plan.n
        if plan.sync:  # our last collective failed where another's completed
            self._share_state(g, holder=self.logical == plan.logical)
            fl = None
        # What the failure-free group would hold once this recovery is done: the
        # replica itself (None) while the interrupted step is outstanding (never
        # applied), or after a completion that dropped nothing.
        reference: Tensors | None = None
        transfer: tuple[int, float] | None = None
        if plan.action == "join":
            t, sent = time.perf_counter(), g.broadcast_bytes
            self._share_state(g, holder=not self.joining)
            transfer = (g.broadcast_bytes - sent, time.perf_counter() - t)
        elif plan.action == "lossy" and plan.complete and fl is not None:
            reference = run_blocking(failure_free(self.replica, fl, g, self.spec,
                                                  plan.buckets_done))
            dropped = run_blocking(complete(self.replica, fl, g, self.spec, plan.buckets_done))
            if g.rank == 0 and dropped:
                post(self.store, StepCompleted(micro_dropped=dropped,
                                               samples_dropped=dropped * self.micro))
            self._commit(g, fl)
        if plan.uncount:
            self.executed -= 1
        if plan.action not in ("start", "join"):
            self.resumed = True
        if plan.action == "start" and self.executed == 0 and g.rank == 0:
            self.post_params()  # the initial evaluation, as sim does
        if g.rank == 0 and plan.action != "start":
            norm = None
            if plan.action in ("rollback", "lossy"):
                now = live_params(self.replica)
                norm = perturbation(now if reference is None else reference, now)[0]
            post(self.store, Reformed(n=plan.n, ranks=list(g.members), action=plan.action,
                                      perturbation=norm,
                                      state_bytes=transfer[0] if transfer else None,
                                      transfer_seconds=transfer[1] if transfer else None))

    def post_before(self) -> None:
        """The group restarts: measure the restart's perturbation, from the replica as
        it was before the interrupted step (as it is: an uncommitted step never touched
        it) to the checkpoint the restart will load, and send that number (the replica
        itself is model-sized: it never goes through the store). A checkpoint still
        being written is finished first: the restart may load it."""
        self.saves.flush()
        self.evals.restart()  # the state the failure struck, evaluated first: the cheaper
        step, norm = self.saves.restart_perturbation(self.replica.params, self.x0)
        post(self.store, Before(step=step, perturbation=norm))

    def save_now(self) -> None:
        """A just-in-time checkpoint of the last committed step (the job is preempted):
        every member holds this state, so any one of them writes it."""
        self.saves.save_now(self.replica, self.logical, self.cursor,
                            self.history[-1][2] if self.history else [self.slot])

    def _share_state(self, g: Group, holder: bool) -> None:
        """Every member takes a holder's replica and counters (a replacement joins, or
        members behind the last committed step catch up)."""
        c = self.cursor
        mine = [self.executed, self.logical, c.epoch, c.offset, int(self.ctl_seen), self.applied]
        m = run_blocking(share_state(self.replica, g, mine, holder=holder))
        self.executed, self.logical, self.cursor = m[0], m[1], Cursor(m[2], m[3])
        self.ctl_seen, self.applied, self.joining = float(m[4]), m[5], False
        self.pending_outer = []  # taken at an outer boundary: none is due

    # -- the step -----------------------------------------------------------------
    def finished(self, size: int) -> bool:
        """The run's budget is spent: attempts (``max_iterations``) or, for a user's
        loop, epochs: the next global batch of a group of ``size`` would begin epoch
        ``limit_epochs`` (the cursor is the same on every member: all stop together)."""
        if self.epochs_over(size):
            return True
        return self.executed >= (self.cfg.max_iterations or 0)

    def epochs_over(self, size: int) -> bool:
        """A user's loop: the next global batch of a group of ``size`` would begin
        epoch ``limit_epochs``."""
        if self.limit_epochs is None:
            return False
        c, batch = self.cursor, self.elastic.decide(size).global_batch
        return c.epoch + (c.offset + batch > self.stream.n) >= self.limit_epochs

    def step(self, g: Group) -> float:
        """Run and commit one step on ``g``; the commit vote's control counter.

        Raises:
            PeerLost: the group broke (the step stays in :attr:`flight`).
        """
        if self.sync is not None:
            return self._relaxed_step(g)
        # Failure triggers count attempts made *before* this one, as sim does.
        before = self.executed
        self.executed += 1
        d = self.elastic.decide(g.size)
        batch = plan_batch(self.stream, self.cursor, d.global_batch, d.lr_scale, g.members,
                           self.micro)
        if self.before_step is not None:
            self.before_step(batch.next_cursor.epoch, self.logical)
        fl = self.flight = InFlight.begin(batch, self.logical,
                                          self.replica.new_grads(separate=False))

        def ballot() -> float:  # the first member shares the controller's counter
            return self._control() if g.rank == 0 else 0.0

        ctl = run_blocking(train_step(self.replica, fl, g, self.inj, self.spec, before, ballot))
        self._commit(g, fl)
        return ctl

    def _relaxed_step(self, g: Group) -> float:
        """An inner step (unless outer steps are outstanding: a loss interrupted them),
        then the outer steps due; the control counter of the last outer step (the
        controller's requests are agreed on there), else the one seen already.

        Raises:
            PeerLost: the group broke at an outer step (it stays outstanding).
        """
        assert self.sync is not None and isinstance(self.replica, RelaxedReplica)
        if not self.pending_outer:
            before = self.executed
            self.executed += 1
            d = self.elastic.decide(g.size)
            batch = plan_batch(self.stream, self.cursor, d.global_batch, d.lr_scale,
                               g.members, self.micro)
            fl = self.flight = InFlight.begin(batch, self.logical,
                                              self.replica.new_grads(separate=False))
            run_blocking(inner_step(self.replica, fl, self.inj, self.spec, before))
            self.pending_outer = self.sync.due(self.logical + 1)
            self._commit(g, fl)

        def ballot() -> float:
            return self._control() if g.rank == 0 else 0.0

        ctl = self.ctl_seen
        while self.pending_outer:
            ctl = run_blocking(outer_step(self.replica, g, self.inj, self.pending_outer[0],
                                          self.executed - 1, ballot))
            self.pending_outer.pop(0)
            self.outer_steps += 1
        return ctl

    def _local_steps(self) -> int | None:
        """What this rank's failure event adds: with a relaxed sync, the local steps it
        takes along (applied since its last outer step)."""
        if isinstance(self.replica, RelaxedReplica):
            return self.replica.since_sync
        return None

    def shown(self) -> Tensors:
        """The parameters evaluated and compared: the replica's (with a relaxed sync,
        those of the last outer step, which every member holds)."""
        if isinstance(self.replica, RelaxedReplica):
            return self.replica.synced_params()
        return self.replica.params

    def _control(self) -> float:
        """The controller's counter, as this process's :class:`~.protocol.Doorbell` has
        heard it: no store round trip on the step path (one cost as much as the
        allreduce). Requests made since this process started are rung at once."""
        if self._bell is None:
            self._bell = Doorbell(self.store, "ctl", int(self.ctl_seen) + 1)
        return float(self._bell.last)

    def close(self) -> None:
        """Stop listening for requests (the run is over for this process)."""
        if self._bell is not None:
            self._bell.close()

    def _commit(self, g: Group, fl: InFlight) -> None:
        self.cursor, self.flight = fl.batch.next_cursor, None
        self.history.append((self.logical, self.attempt, list(g.members)))
        self.last_share = fl.batch.share.get(self.slot, [])
        self.logical += 1
        self.applied += g.size
        if g.rank != 0:
            return
        if self.resumed:
            post(self.store, Resumed(iteration=self.executed))
        recovered, self.resumed = self.resumed, False
        self.saves.after_commit(self.replica, self.logical, self.cursor, g.members)
        # Relaxed sync: the parameters evaluated change only at outer steps, so one
        # look-back copy per outer step (the step it follows) is all there is to keep.
        keep = self.evaluate_here is None and (self.sync is None or bool(self.pending_outer))
        # A copy of the parameters only where one may be kept (a user's loop keeps none).
        if self.evals.after_commit(self.executed, self.logical, self.applied,
                                   self.shown() if keep else {}, recovered, keep=keep):
            self.post_params()

    def post_params(self, final: bool = False) -> None:
        """Evaluate the replica here, in place, and send the scores to the controller
        (the workload's ``evaluate`` of :meth:`shown`, or a user's loop's own,
        :attr:`evaluate_here`). The last one (``final``) leaves the copies kept for
        look-backs first; an iteration evaluated already is not evaluated again."""
        if final and self.evals.posted == self.executed:
            self.evals.leave()
            return
        ev = self._evaluate()
        if final:
            self.evals.leave((self.executed, ev))
        self.evals.post(self.executed, self.logical, self.applied, ev, final=final)

    def _evaluate(self) -> Evaluation:
        if self.evaluate_here is not None:
            return self.evaluate_here()
        assert self.scorer is not None  # a workload's trainer has one, a loop's evaluate_here
        return self.scorer.evaluate(self.shown())

    def finish(self) -> dict[str, Any]:
        """What every rank reports at the end: counters and a hash of its replica."""
        self.saves.flush()
        h = hashlib.sha256()
        # The live parameters, one at a time (a copy of the model here would set the
        # run's peak memory); with a relaxed sync, those of the last outer step.
        shown = (self.replica.synced_params() if isinstance(self.replica, RelaxedReplica)
                 else live_params(self.replica))
        for n in sorted(shown):
            # As bytes, whatever the dtype (numpy has no bfloat16).
            h.update(shown[n].detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                     .numpy().data)
        return {"slot": self.slot, "executed": self.executed, "logical": self.logical,
                "params_sha256": h.hexdigest(), "outer_steps": self.outer_steps,
                "peak_rss": peak_rss()}


def peak_rss() -> int:
    """This process's peak resident set size in bytes (0 where ``resource`` is missing).
    A rank forked from the zygote starts from the zygote's size at the fork, as a plain
    process starts from its own imports."""
    try:
        import resource
    except ImportError:  # not on Windows
        return 0
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kib) * (1 if sys.platform == "darwin" else 1024)  # macOS reports bytes
