"""One rank process's life in the run: plans, groups and steps, one step at a time.

The same session runs under a trainthrough workload (``rank_main``: ``while
session.step(): pass``) and under a user's own loop (:mod:`trainthrough.loop`: each
``loop.step(loss_fn)`` is one :meth:`RankSession.step`). Call order:

1. :meth:`RankSession.begin`: restore (a restarted process), say ready, wait for the
   plan that takes this process in, form the group and recover as the plan says;
2. :meth:`RankSession.step` until it returns False: one committed step; a broken
   group is reported (protocol.py, ``Report``) and the next plan carried out inside
   the call, so the caller sees steps, never failures (a rolled-back step is redone
   before it returns);
3. :meth:`RankSession.end`: the last words (counters, a hash of the replica).

A process the next plan leaves out (checkpoint-restart ends every process; a rank
presumed failed, or an incarnation of its slot the plan does not name: it was fenced
while paused; a rank that got its preemption notice, :mod:`.notice`, once the group
stopped after a step) is :attr:`retired`: ``step`` returns False and a user's loop is
unwound (:class:`~trainthrough.errors.Retired`, raised by ``Loop.step``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import torch.distributed as dist

from trainthrough.dp.collective import PeerLost
from trainthrough.engines.gloo.group import Group
from trainthrough.engines.gloo.messages import Exit
from trainthrough.engines.gloo.notice import RankNotice
from trainthrough.engines.gloo.protocol import (
    PLAN_WAIT_SECONDS,
    RankSpec,
    Report,
    has,
    post,
    wait_plan,
    write_report,
)
from trainthrough.engines.gloo.trainer import Trainer
from trainthrough.errors import UserError


class RankSession:
    """The plan loop of one rank process around its :class:`~.trainer.Trainer`."""

    #: The session of this process (one per rank process), once built: how far it got
    #: is what an error of this process reports (rank_main.error_message).
    current: ClassVar[RankSession | None] = None

    def __init__(self, spec: RankSpec, store: dist.Store, trainer: Trainer) -> None:
        RankSession.current = self
        self.spec, self.store, self.tr = spec, store, trainer
        if RankNotice.current is not None:  # a notice says how far this rank got
            RankNotice.current.logical = lambda: trainer.logical
        self.slot, self.n = spec.slot, spec.attempt
        self.g: Group | None = None
        self.over = False  # the run ended for this process (normally or retired)
        self.retired = False  # it ended because a plan left it out
        # The controller's choice for every rank of the run (dp/devices.py).
        self.backend = spec.run.collective
        if self.backend == "nccl" and trainer.replica.device.type != "cuda":
            raise UserError(f"the run's collective is NCCL, but rank {self.slot}'s model is on "
                            f"{trainer.replica.device}: move it to loop.device")

    def begin(self) -> None:
        """Restore, say ready, and take part in the first plan that includes us."""
        spec, tr = self.spec, self.tr
        if spec.mode == "restart":
            tr.restore(spec.restore)
            tr.resumed = True  # its first commit ends the recovery
        tr.executed, tr.ctl_seen, tr.applied = spec.executed, float(spec.ctl), spec.applied
        self.store.set(f"ready/{self.slot}/{spec.inc}", "1")
        if spec.mode == "join":  # the controller says which attempt takes us in
            key = f"join/{self.slot}/{spec.inc}"
            self.store.wait([key], timedelta(seconds=PLAN_WAIT_SECONDS))
            self.n = int(self.store.get(key))
        self._enter()

    def _enter(self) -> None:
        """Carry out plans from attempt :attr:`n` on until one forms a group with us."""
        while True:
            plan = wait_plan(self.store, self.n)
            if plan.saves(self.slot, self.spec.inc):  # the job is preempted: save first
                self.tr.save_now()
            if plan.action == "exit" and plan.members[:1] == [self.slot] \
                    and plan.admits(self.slot, self.spec.inc):
                self.tr.post_before()  # the first survivor: what the restart is measured against
            # The plan names its members' incarnations: one that wakes after its slot was
            # given to a replacement (a pause) reads that it is out, and leaves.
            if not plan.admits(self.slot, self.spec.inc) or plan.action in ("exit", "stop"):
                self.g, self.over, self.retired = None, True, True
                return
            g = Group(self.store, self.n, plan.members, self.slot,
                      self.tr.cfg.cost.timeout_seconds, self.backend, self.tr.replica.device)
            try:
                g.form()
                self.tr.recover(g, plan)
            except PeerLost as e:
                self._broken(e, g)
                continue
            deadline = self.tr.cfg.straggler_deadline
            if deadline is not None:  # the steps' collectives wait this long, no longer
                g.pace(deadline)
            self.g = g
            return

    def _broken(self, e: PeerLost, g: Group) -> None:
        tr = self.tr
        write_report(self.store, self.n, Report(self.slot, "error", e.phase, e.buckets_done,
                                                tr.executed, tr.logical, e.t, e.message,
                                                waited=g.waited, inc=self.spec.inc))
        self.n += 1

    def step(self) -> bool:
        """Commit one more step, through any failure; False once the run is over here."""
        while not self.over and self.g is not None:
            if self.tr.finished(self.g.size):
                self.close(final=True)
                return False
            try:
                ctl = self.tr.step(self.g)
            except PeerLost as e:
                self._broken(e, self.g)
                lost = True
            else:
                lost = False
            if lost:  # outside the handler: see Group._run on what a live exception holds
                self._enter()
                continue
            if ctl != self.tr.ctl_seen:
                self.tr.ctl_seen = ctl
                if has(self.store, "stop"):
                    self.close(final=True)
                    return False
                # The controller asked for a change (a replacement joins) after this step.
                self.g.close()
                write_report(self.store, self.n, Report(self.slot, "ctl",
                                                        executed=self.tr.executed,
                                                        logical=self.tr.logical,
                                                        inc=self.spec.inc))
                self.n += 1
                self._enter()
                if self.over:
                    return False
            return True
        return False

    def close(self, final: bool) -> None:
        """Leave the group at the end of the run (``final``: the first member sends
        the final parameters or metrics)."""
        assert self.g is not None
        self.tr.saves.flush()  # a background write's report before the last words
        if final and self.g.rank == 0:
            self.tr.post_params(final=True)
        self.g.close()
        self.g, self.over = None, True

    def end(self) -> dict[str, Any]:
        """Post this process's last words; what it reports."""
        if self.g is not None:
            self.g.close()
            self.g = None
        self.tr.close()
        out = {**self.tr.finish(), "history": self.tr.history}
        post(self.store, Exit(**out))
        return out
