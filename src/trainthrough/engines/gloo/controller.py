"""The ``dist`` engine's controller: data-parallel training on real gloo processes.

The controller is the parent of every rank. It owns the ``TCPStore`` (a free port on
127.0.0.1, or on the address :mod:`.net` chooses for a run that spans hosts or names
one) that outlives the ranks, starts them, and, woken by every event a rank
posts and at least every :data:`~.timing.TICK` seconds: drains their events (failures they
inflict on themselves, checkpoints, evaluations), notices processes that
ended (and what they said as they did) or whose heartbeat stopped (:mod:`.liveness`),
and watches for reports (a group broke, or the ranks stopped because it asked). It
never gives up on ranks that are alive, however long they compute: a hang is found by
the ranks' own collective timeout or a heartbeat that stops (timing.py says which
timeout guards what). It holds no parameters: the first rank evaluates its own
replica and posts the scores (:mod:`.evals`), so the store carries control messages
only, whatever the model's size. Recovery decisions come from the same policies as ``sim``
(ft/dp_policies.py) and are carried out by :class:`~.recovery.DistRecovery`; its
one Checkpointer counts the saves rank 0 reports (:class:`~.checkpoints.ControllerSaves`).
Times are wall-clock; ``sim_seconds`` in records equals ``wall_seconds``.

Preemption (:mod:`.preempt`): a rank's notice is handled by the recovery (it drains);
SIGTERM to the controller's own process is noted (:class:`~.preempt.JobNotice`) and
acted on between two ticks: the group stops after a step with a just-in-time
checkpoint, within :data:`~.timing.JOB_NOTICE_SECONDS`, before the job ends as
``interrupted`` (``--resume`` then loses no committed step).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from trainthrough.dp.allreduce import plan_buckets
from trainthrough.dp.batching import Cursor, SampleStream
from trainthrough.dp.devices import cuda_count, plan_devices
from trainthrough.dp.rank import Rank
from trainthrough.engines.base import RunContext
from trainthrough.engines.gloo.checkpoints import ControllerSaves
from trainthrough.engines.gloo.evals import ControllerEvals
from trainthrough.engines.gloo.faults import check_specs, order_dicts, resolve_orders
from trainthrough.engines.gloo.liveness import Watch
from trainthrough.engines.gloo.messages import (
    Awake,
    Before,
    Copies,
    Exit,
    Failed,
    Message,
    Metrics,
    Noticed,
    Reported,
    Returned,
    Saved,
    parse,
)
from trainthrough.engines.gloo.net import rank_net, store_host
from trainthrough.engines.gloo.preempt import JobNotice
from trainthrough.engines.gloo.procs import Launch, Proc, Procs, local_launch
from trainthrough.engines.gloo.protocol import EventReader, RunSpec, request, serve
from trainthrough.engines.gloo.recovery import DistRecovery
from trainthrough.engines.gloo.timing import JOB_NOTICE_SECONDS, TICK, heartbeat_period
from trainthrough.engines.result import RunResult
from trainthrough.errors import Preempted, UserError
from trainthrough.events import CheckpointCorrupt, Event, JobPreempted, PauseEnded, RankSilent
from trainthrough.ft.dp_policies import ElasticPolicy
from trainthrough.workloads.base import Evaluation


class GlooEngine:
    """Runs one data-parallel configuration on ``cfg.ranks`` gloo processes.

    ``launch`` starts one rank process from its spec (None: local processes, forked
    from a warm zygote or started with ``python -m``, :func:`~.procs.local_launch`; the
    ray engine hosts ranks on actors with the same controller).
    """

    launch: Launch | None = None
    #: Rank processes take SIGTERM as a preemption notice (notice.py); a host that
    #: handles SIGTERM itself (a Ray actor) does not.
    takes_notice = True

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
        self.logical = self.iteration = 0  # the latest the ranks told us of
        self.hashes: dict[int, str] = {}
        self.peak_rss: dict[int, int] = {}  # slot -> the largest of its processes' peaks
        self.outer_steps = 0  # relaxed sync: the most any rank completed
        self.histories: dict[int, list[list[Any]]] = {}  # slot -> committed (logical, attempt, members)
        self.returned: dict[int, Any] = {}  # a user's loop: what train() returned, by slot
        # mode=pause: processes stopped by their order, (process, when it stopped, when
        # to continue it); continued once due (and stopped: see Pinned.resume).
        self.pauses: list[tuple[Proc, float, float]] = []
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
            RankFailed: a rank's error repeated the same way more than ``max_restarts``
                times in a row, or a rank was lost where nothing recovers it (while
                starting); one line, the rank's own error first.
        """
        self.t0 = time.time()  # ranks measure @time triggers from here (wall clock)
        self.ctx.start_clock()
        cluster_ip = self.cluster_ip()
        self.host = store_host(self.cfg.bind_address, cluster_ip)
        store = serve(self.host, timeout=30)
        # What every rank reads resolved as the controller has it: the first member
        # evaluates by the same schedule and target test (evals.py).
        lim = self.ctx.limits
        cfg = replace(self.cfg, max_iterations=self.max_iter, eval_every=lim.eval_every,
                      target=lim.target)
        beat = heartbeat_period(cfg.liveness_timeout)
        base = RunSpec(cfg.to_dict(), self.host, store.port, self.t0, self.url, self.program,
                       rank_net(self.cfg.bind_address, cluster=cluster_ip is not None),
                       self.devices.collective.backend, self.devices.gpus_per_rank, beat,
                       notice=self.takes_notice)
        self.store, self.events = store, EventReader(store)
        self.watch = Watch(store, cfg.liveness_timeout, beat)
        self.evals = ControllerEvals(self, copies=self.program is None)
        self.evals.start()
        self.procs = Procs(store, base, self.start_rank)
        self.rec = DistRecovery(self, order_dicts(self.orders))
        ended = False
        self.term = JobNotice()
        try:
            self.term.install()
            self.cb.before_run(self.cfg.to_dict())
            restore = self._resume() if self.ctx.resume else None
            # Resumed: every rank starts as a checkpoint-restart's do, from that save.
            self.rec.start(range(self.cfg.ranks), "fresh" if restore is None else "restart",
                           attempt=0, executed=restore or 0, restore=restore)
            self._loop()
            ended = True
        finally:
            self.term.restore()
            for p, _ in self.rec.joiners:  # warm replacements that never got to join
                self.procs.kill(p)
            # A run cut short (an error, Ctrl-C, SIGTERM) ends its ranks at once: they
            # would train on, not exit, in the seconds a finished run's are given.
            self.procs.shutdown(timeout=5.0 if ended else 0.0)
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
        while True:
            if self.term.given is not None:  # the job's notice: save, then end as it says
                self._preempted(self.term.given)
                self.term.end()
            if self.rec.all_drained and self.rec.stop_done():
                self._preempted(self.rec.drained_at)
                raise Preempted("every rank of the run got its preemption notice")
            self.pump()
            self.rec.tick()
            if self.rec.finished():
                return
            if (self.cfg.wall_limit is not None and not self.stopping
                    and time.time() - self.t0 >= self.cfg.wall_limit):
                self.request_stop()
            self._look_for_silence()
            self._end_pauses()
            self.events.bell.wait(TICK)  # an event wakes us at once

    def _look_for_silence(self) -> None:
        """End the processes whose heartbeat stopped: stopped or frozen, they are lost
        (their end is then a death like any other, dated from their last beat)."""
        now = time.time()
        # A process fenced while it ran (paused, hung: fencing.py) that stays silent is
        # ended by the same timeout: it holds memory, and if it woke it would only leave.
        members = [p for p in self.procs.current.values() if not p.fenced]
        for p, since in self.watch.silent(members + self.procs.fenced_running(), now):
            if p.fenced:
                self.procs.kill(p)
                continue
            self.emit(RankSilent(slot=p.slot, silent_seconds=round(now - since, 3)))
            # Fenced first: the kill ends it here, but a process out of reach (another
            # host) that wakes later must find itself out all the same.
            self.rec.fences.revoke(p.slot, p.inc, "silent")
            self.procs.lose(p, since)

    def _end_pauses(self) -> None:
        """Continue the processes whose pause is over (``mode=pause``), by the handle
        pinned when this run started them; one that ended meanwhile is dropped."""
        now, left = time.time(), []
        for p, stopped, due in self.pauses:
            if now < due or not p.process.resume():
                left.append((p, stopped, due))
            elif p.exitcode is None:
                self.emit(PauseEnded(slot=p.slot, inc=p.inc,
                                     paused_seconds=round(now - stopped, 3),
                                     member=not p.fenced))
        self.pauses = left

    def pump(self) -> bool:
        """Handle every message the ranks posted so far; returns whether there were any."""
        events = self.events.drain()
        for wire in events:
            m = parse(wire)
            # From an incarnation taken out of the group: refused unread (fencing.py).
            if not self.rec.fences.refuses(m.sender, m.TYPE):
                self._on_event(m)
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
    def _on_event(self, m: Message) -> None:
        if isinstance(m, Metrics):  # the first member evaluated its state after a commit
            self.logical = m.logical  # goes back on a restart
            self.iteration = max(self.iteration, m.iteration)
            self.result.updates_applied = m.applied
            self.evals.on_metrics(m)
            return
        if isinstance(m, Copies):  # kept by the first member, scored there: a look-back
            self.evals.on_copies(m)
            return
        if isinstance(m, Returned):
            self.returned[m.slot] = m.value
            return
        if isinstance(m, Exit):
            self.hashes[m.slot] = m.params_sha256
            self.peak_rss[m.slot] = max(self.peak_rss.get(m.slot, 0), m.peak_rss)
            self.outer_steps = max(self.outer_steps, m.outer_steps)
            self.histories.setdefault(m.slot, []).extend(m.history)
            self.result.iterations = max(self.result.iterations, m.executed)
            return
        if isinstance(m, Saved):  # a report to the Checkpointer, which emits the event
            self.saves.on_saved(m)
            return
        if isinstance(m, Before):  # the restart under way, as the first survivor measured it
            self.saves.before = m
            return
        if isinstance(m, Awake):  # a pause the group never noticed (else it was refused)
            if m.sender is not None:
                self.rec.log.awake(m.sender[0], m.spec)
            return
        if isinstance(m, Failed) and m.mode == "pause" and m.sender is not None:
            p = next((q for q in self.procs.started
                      if [q.slot, q.inc] == list(m.sender)), None)
            if p is not None and m.pause_seconds is not None:
                now = time.time()  # this clock, not the rank's (another host's, maybe)
                self.pauses.append((p, now, now + m.pause_seconds))
        if isinstance(m, Reported):  # a member wrote its report: the recovery reads them now
            self.rec.reported = self.rec.reported or m.n >= self.rec.n
            return
        if isinstance(m, Noticed):  # a rank's preemption notice: it drains
            self.rec.on_notice(m)
            return
        self.emit(self.rec.on_event(m))  # the wire message, as its event

    def _preempted(self, since: float) -> None:
        """The job got its notice at ``since``: stop the group after a step with a
        just-in-time checkpoint (a run that keeps checkpoints), waiting at most
        :data:`~.timing.JOB_NOTICE_SECONDS` from the notice; say what was saved."""
        if self.rec.stopped is not None or (self.saves.saver is not None
                                            and self.rec.stop_with_save()):
            while time.time() - since < JOB_NOTICE_SECONDS and not self.rec.stop_done():
                self.pump()
                self.rec.tick()
                self.events.bell.wait(TICK)
            self.pump()  # the save's report, posted before the saver ended
        self.emit(JobPreempted(logical=self.rec.stop_logical, saved=self.saves.jit,
                               seconds=round(time.time() - since, 3)))

    @property
    def group_size(self) -> int:
        return len(self.rec.members)

    def evaluate(self, m: Metrics, scored: Evaluation, look_back: bool = False) -> None:
        """Record an evaluation of the state ``m`` describes; stop at the target."""
        it = m.iteration
        done = self.ctx.evaluate({}, it, scored=scored, look_back=look_back,
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
            writes_refused=self.rec.fences.refused,
            ranks_drained=self.rec.drains.drained,
            samples_dropped=log.samples_dropped, logical_iterations=self.logical,
            detection_seconds=log.detections, reform_seconds=log.reform_times,
            restart_seconds=log.restart_times,
            replicas_identical=bool(hashes) and None not in hashes and len(set(hashes)) == 1,
            peak_rss_bytes=[self.peak_rss.get(s) for s in range(self.cfg.ranks)],
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

