"""The ``dist`` engine's controller: data-parallel training on real gloo processes.

The controller is the parent of every rank. It owns the ``TCPStore`` (a free port on
127.0.0.1, or on the address :mod:`.net` chooses for a run that spans hosts or names
one) that outlives the ranks, starts them, and, woken by every event a rank
posts and at least every :data:`~.timing.TICK` seconds: drains their events (failures they
inflict on themselves, checkpoints, parameters to evaluate), notices processes that
ended, and watches for reports (a group broke, or the ranks
stopped because it asked). It never trains: evaluation is the only tensor work it
does. Recovery decisions come from the same policies as ``sim``
(ft/dp_policies.py) and are carried out by :class:`~.recovery.DistRecovery`; its
one Checkpointer counts the saves rank 0 reports (:class:`~.checkpoints.ControllerSaves`).
Times are wall-clock; ``sim_seconds`` in records equals ``wall_seconds``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import safetensors.torch
import torch

from trainthrough.dp.allreduce import plan_buckets
from trainthrough.dp.batching import Cursor, SampleStream
from trainthrough.dp.devices import cuda_count, plan_devices
from trainthrough.dp.rank import Rank
from trainthrough.engines.base import RunContext
from trainthrough.engines.gloo.checkpoints import ControllerSaves
from trainthrough.engines.gloo.evals import ControllerEvals
from trainthrough.engines.gloo.faults import check_specs, order_dicts, resolve_orders
from trainthrough.engines.gloo.messages import (
    Before,
    Copies,
    Exit,
    Message,
    Metrics,
    Params,
    RankError,
    Reported,
    Returned,
    Saved,
    parse,
)
from trainthrough.engines.gloo.net import rank_net, store_host
from trainthrough.engines.gloo.procs import Launch, Procs, local_launch
from trainthrough.engines.gloo.protocol import EventReader, RunSpec, request, serve
from trainthrough.engines.gloo.recovery import DistRecovery
from trainthrough.engines.gloo.timing import TICK, stall_seconds
from trainthrough.engines.result import RunResult
from trainthrough.errors import UserError
from trainthrough.events import CheckpointCorrupt, Event
from trainthrough.ft.dp_policies import ElasticPolicy
from trainthrough.workloads.base import Evaluation


class GlooEngine:
    """Runs one data-parallel configuration on ``cfg.ranks`` gloo processes.

    ``launch`` starts one rank process from its spec (None: local processes, forked
    from a warm zygote or started with ``python -m``, :func:`~.procs.local_launch`; the
    ray engine hosts ranks on actors with the same controller).
    """

    launch: Launch | None = None

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        cfg, workload = ctx.cfg, ctx.workload
        self.cfg, self.w, self.cb, self.url = cfg, workload, ctx.callback, ctx.checkpoint_url
        ctx.strategy.require("dp")
        # A user's own loop (trainthrough.loop): its model exists in the ranks only, so
        # the ranks check it; otherwise everything a rank would trip over is checked
        # here, before any process starts.
        self.program = workload.rank_program()
        template = None if self.program is not None else self._check_workload()
        # Decided once here (every rank forms its groups with the same backend).
        self.devices = plan_devices(cfg.device, cfg.collective, self.program is not None,
                                    cfg.ranks, cuda_count())
        schedule = ctx.schedule({"rank": cfg.ranks})
        # A user's model is built in the ranks: its buckets are known here only by count.
        check_specs(ctx.specs, cfg.allreduce_buckets if template is None else
                    len(plan_buckets(template.layout.numel, cfg.allreduce_buckets)))
        if cfg.cost.timeout_seconds <= 0:
            raise UserError("cost.timeout_seconds (the collective timeout) must be positive")
        self.schedule, self.orders = schedule, resolve_orders(schedule)
        self.max_iter = ctx.limits.max_iterations
        self.result, self.strategy = ctx.result, ctx.strategy
        self.stopping = False
        self.last_eval: int | None = None
        self.logical = self.iteration = 0  # the latest the ranks told us of
        self.hashes: dict[int, str] = {}
        self.outer_steps = 0  # relaxed sync: the most any rank completed
        self.histories: dict[int, list[list[Any]]] = {}  # slot -> committed (logical, attempt, members)
        self.returned: dict[int, Any] = {}  # a user's loop: what train() returned, by slot
        # Chosen (and the zygote set importing) before anything else is built.
        self.start_rank: Launch = self.launch or local_launch()
        self.saves = ControllerSaves(cfg, ctx.strategy, self.url, template,
                                     cfg.checkpoint_every or workload.default_checkpoint_every,
                                     self.emit)

    def _check_workload(self) -> Rank:
        """Refuse what the ranks would trip over; a replica as they build theirs (what a
        checkpoint must hold, and x0)."""
        cfg, workload = self.cfg, self.w
        n = workload.sample_count()
        if n is None:
            raise UserError(f"workload {workload.name} does not support data-parallel training; "
                            "use mlr, cnn or a TorchWorkload")
        spec = workload.default_optimizer if cfg.lr is None else replace(
            workload.default_optimizer, lr=cfg.lr)
        template = Rank(0, workload, spec,
                        workload.init_params(torch.Generator().manual_seed(cfg.seed)), cfg.seed)
        numel = template.layout.numel
        if cfg.allreduce_buckets is not None and not 1 <= cfg.allreduce_buckets <= numel:
            raise UserError(f"allreduce-buckets must be between 1 and the {numel} parameters "
                            f"of {workload.name} (got {cfg.allreduce_buckets})")
        elastic = ElasticPolicy(cfg.elastic, cfg.ranks, workload.batch_size)
        SampleStream(n, cfg.seed).take(Cursor(), elastic.decide(cfg.ranks).global_batch)
        return template

    # -- lifecycle --------------------------------------------------------------
    def run(self) -> RunResult:
        """Start the ranks, supervise them to the end, return the result.

        Raises:
            UserError: a rank's user code refused to go on (a diverged loss), in one line.
            RuntimeError: a rank hit a bug (its traceback is in the message), or the
                run stopped making progress.
        """
        self.t0 = time.time()  # ranks measure @time triggers from here (wall clock)
        self.ctx.start_clock()
        cluster_ip = self.cluster_ip()
        self.host = store_host(self.cfg.bind_address, cluster_ip)
        store = serve(self.host, timeout=30)
        cfg = replace(self.cfg, max_iterations=self.max_iter)
        base = RunSpec(cfg.to_dict(), self.host, store.port, self.t0, self.url, self.program,
                       rank_net(self.cfg.bind_address, cluster=cluster_ip is not None),
                       self.devices.collective.backend, self.devices.gpus_per_rank)
        self.store, self.events = store, EventReader(store)
        self.evals = ControllerEvals(self)
        self.evals.start()
        self.procs = Procs(store, base, self.start_rank)
        self.rec = DistRecovery(self, order_dicts(self.orders))
        try:
            self.cb.before_run(self.cfg.to_dict())
            restore = self._resume() if self.ctx.resume else None
            # Resumed: every rank starts as a checkpoint-restart's do, from that save.
            self.rec.start(range(self.cfg.ranks), "fresh" if restore is None else "restart",
                           attempt=0, executed=restore or 0, restore=restore)
            self._loop()
        finally:
            for p, _ in self.rec.joiners:  # warm replacements that never got to join
                self.procs.kill(p)
            self.procs.shutdown()
        self.pump()  # the last words of the last ranks
        self.events.bell.close()
        self.evals.close()  # an evaluation still waiting for copies: score it with what came
        return self._finish()

    def cluster_ip(self) -> str | None:
        """This machine's address on the cluster the run spans (None: one machine)."""
        return None

    def _resume(self) -> int:
        """``--resume``: the run's newest valid checkpoint, chosen here once for every
        rank (as a restart's); the failures delivered before it are dropped.

        Raises:
            UserError: no valid checkpoint (:meth:`RunContext.resumed`).
        """
        saver = self.saves.saver
        r = (saver.latest(lambda msg: self.emit(CheckpointCorrupt(message=msg)))
             if saver is not None else None)
        step = self.ctx.resumed(r.step if r is not None else None, self.schedule,
                                self.saves.checkpointer)
        self.orders = resolve_orders(self.schedule)
        self.rec.orders = order_dicts(self.orders)
        self.logical = self.iteration = step
        return step

    def _loop(self) -> None:
        idle_since = time.time()
        stall = stall_seconds(self.cfg.cost.timeout_seconds)
        while True:
            progressed = self.pump()
            progressed = self.rec.tick() or progressed
            if self.rec.finished():
                return
            if (self.cfg.wall_limit is not None and not self.stopping
                    and time.time() - self.t0 >= self.cfg.wall_limit):
                self.request_stop()
            now = time.time()
            if progressed:
                idle_since = now
            elif now - idle_since > stall:
                raise RuntimeError(f"dist engine: no progress for {stall:.0f} s "
                                   f"(state {self.rec.state.value}); giving up")
            self.events.bell.wait(TICK)  # an event wakes us at once

    def pump(self) -> bool:
        """Handle every message the ranks posted so far; returns whether there were any."""
        events = self.events.drain()
        for wire, blob in events:
            self._on_event(parse(wire), blob)
        return bool(events)

    def request_stop(self) -> None:
        """Every member stops after the same step (see protocol.py, ``ctl``)."""
        if not self.stopping:
            self.stopping = True
            self.store.set("stop", "1")
            request(self.store)

    def emit(self, event: Event) -> None:
        self.ctx.emit(event)

    # -- what the ranks tell us ---------------------------------------------------
    def _on_event(self, m: Message, blob: bytes | None) -> None:
        if isinstance(m, RankError) and m.user is not None:  # one line (exit code 2)
            raise UserError(m.user)
        if isinstance(m, RankError):
            raise RuntimeError(f"dist engine: rank {m.slot} failed with a bug:\n{m.traceback}")
        if isinstance(m, (Params, Metrics)):  # the first member's state after a commit
            self.logical = m.logical  # goes back on a restart
            self.iteration = max(self.iteration, m.iteration)
            self.result.updates_applied = m.applied
            if isinstance(m, Params):
                assert blob is not None
                self.evals.on_params(m, safetensors.torch.load(blob))
            elif m.iteration != self.last_eval or not m.final:
                # A user's loop evaluated its own model on its first rank.
                self.evaluate(m, {}, Evaluation(m.metric, m.loss))
            return
        if isinstance(m, Copies):  # kept by the first member, for a look-back
            assert blob is not None
            self.evals.on_copies(m, safetensors.torch.load(blob))
            return
        if isinstance(m, Returned):
            self.returned[m.slot] = m.value
            return
        if isinstance(m, Exit):
            self.hashes[m.slot] = m.params_sha256
            self.outer_steps = max(self.outer_steps, m.outer_steps)
            self.histories.setdefault(m.slot, []).extend(m.history)
            self.result.iterations = max(self.result.iterations, m.executed)
            return
        if isinstance(m, Saved):  # a report to the Checkpointer, which emits the event
            self.saves.on_saved(m)
            return
        if isinstance(m, Before):  # what the restart under way is measured against
            assert blob is not None
            self.saves.before = safetensors.torch.load(blob)
            return
        if isinstance(m, Reported):  # a member wrote its report: the recovery reads them now
            self.rec.reported = self.rec.reported or m.n >= self.rec.n
            return
        self.emit(self.rec.on_event(m))  # the wire message, as its event

    @property
    def group_size(self) -> int:
        return len(self.rec.members)

    def evaluate(self, m: Params | Metrics, params: dict[str, torch.Tensor],
                 scored: Evaluation, look_back: bool = False) -> None:
        """Record an evaluation of the state ``m`` describes; stop at the target."""
        it = m.iteration
        self.last_eval = it
        done = self.ctx.evaluate(params, it, scored=scored, look_back=look_back,
                                 logical_iteration=m.logical,
                                 ranks=self.group_size)
        self.cb.after_step(it, self.ctx.wall())
        if done:
            self.request_stop()

    def _finish(self) -> RunResult:
        r, log, c = self.result, self.rec.log, self.saves.checkpointer
        r.failures = log.failures
        r.checkpoints, r.checkpoint_bytes, r.checkpoint_blocked_seconds = c.count, c.bytes, c.blocked
        r.checkpoints_failed = c.failed
        r.wall_seconds = r.sim_seconds = self.ctx.wall()
        live = sorted(self.rec.members)
        hashes = [self.hashes.get(s) for s in live]
        r.extras.update(self.devices.record())
        r.extras.update(
            paradigm="dp", ranks=self.cfg.ranks, ranks_final=len(live), ranks_min=log.smallest,
            reforms=log.reforms, restarts=log.restarts, ranks_joined=log.joined,
            samples_dropped=log.samples_dropped, logical_iterations=self.logical,
            detection_seconds=log.detections, reform_seconds=log.reform_times,
            restart_seconds=log.restart_times,
            replicas_identical=bool(hashes) and None not in hashes and len(set(hashes)) == 1,
            store_address=f"{self.host}:{self.store.port}",
            time_to_target=r.sim_seconds_to_target)
        if self.ctx.strategy.relaxed:
            r.extras.update(sync=self.ctx.strategy.sync, sync_every=self.cfg.sync_every,
                            outer_steps=self.outer_steps,
                            local_steps_lost=log.local_steps_lost,
                            local_steps_lost_total=sum(log.local_steps_lost))
        if self.program is not None:
            r.extras.update(returned=self.returned.get(min(self.returned, default=0)),
                            committed=_lineage(self.histories))
        return r


def _lineage(histories: dict[int, list[list[Any]]]) -> list[list[Any]]:
    """The committed steps of the run as every process recorded them: ``[logical,
    attempt, members]``, one per (logical, attempt), in order (a restart's lost steps
    appear twice, with the attempt that redid them)."""
    seen = {(int(h[0]), int(h[1])): [int(h[0]), int(h[1]), list(h[2])]
            for hs in histories.values() for h in hs}
    return [seen[k] for k in sorted(seen)]

