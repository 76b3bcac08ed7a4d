"""Membership and recovery for the ``dist`` controller: start, fail, re-form, restart, grow.

States (:mod:`.group_state`, which says which fields mean something when): STARTING
(processes spawned, waiting until every one is ready, then the start plan is
published), TRAINING (a group is running; watch for reports and deaths), REPORTING
(the group ended: wait for the reports), and back. When a group breaks, the
survivors report; the controller waits until every member whose process is still alive
has reported, or the deadline ``timing.report_deadline`` sets (a grace period after a
report that its collective timed out; else the collective timeout, since a live member
may be evaluating or saving before it reaches its next collective); a hung or paused
rank never reports: it is then presumed failed and fenced (:mod:`.fencing`), not
killed: its peers have left it, and if it ever runs again it finds itself out and
leaves (one that stays stopped is ended by the liveness timeout). Who reported is who
is alive: that is the agreement. With a straggler deadline, a member that reported
late (its peers waited the deadline out for it) is fenced and dropped too
(:class:`~trainthrough.ft.dp_policies.StragglerPolicy`), and replaced. A member lost without a failure order (its code raised, it was
killed, presumed hung, silent) is counted by :class:`~.crashes.Crashes` first, which
ends the run once such a failure repeats the same way (``max_restarts``). The strategy's
policy (the same as ``sim``'s) then decides:

- rollback / lossy-forward: publish the next attempt with the survivors, and spawn
  replacements at once; each waits, warm, until ``recovery_delay`` seconds after the
  failure, then the controller asks the group to stop after a step (``ctl``) and
  publishes an attempt that includes it (the first member broadcasts its state);
- checkpoint-restart: every process exits and ``ranks`` fresh ones start from the
  one checkpoint the controller chose (a restart, as torchrun does).

A rank with a preemption notice (:mod:`.preempt`) is no failure: the controller asks
the group to stop after a step, as for a replacement, and the next attempt goes on
without it (``drained``), spawning its replacement as for a loss; if no member would
be left, or the whole job got its notice, the group stops with a just-in-time
checkpoint (a ``stop`` plan with ``save``).

The perturbation comes with the re-formation (measured by the first member) or from
the checkpoint chosen (:meth:`~.checkpoints.ControllerSaves.choose`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trainthrough.dp.step import group_phase
from trainthrough.engines.gloo.crashes import Crashes
from trainthrough.engines.gloo.fencing import Fences
from trainthrough.engines.gloo.group_state import (
    TRANSITIONS,
    GroupState,
    GroupStateError,
    OpenRecovery,
)
from trainthrough.engines.gloo.ledger import RecoveryLog
from trainthrough.engines.gloo.messages import Failed, Message, Noticed
from trainthrough.engines.gloo.preempt import Drains
from trainthrough.engines.gloo.procs import Proc
from trainthrough.engines.gloo.protocol import (
    Plan,
    Report,
    read_last_words,
    read_reports,
    request,
    write_plan,
)
from trainthrough.engines.gloo.timing import START_SECONDS, report_deadline, timed_out
from trainthrough.errors import UserError
from trainthrough.events import (
    CheckpointCorrupt,
    Detection,
    Drained,
    Event,
    PreemptExpired,
    PreemptNotice,
    Restored,
)
from trainthrough.ft.decisions import RecoveryAction
from trainthrough.ft.dp_policies import (
    GroupFailure,
    ReplacementPolicy,
    StragglerPolicy,
    group_recovery_policy,
)

if TYPE_CHECKING:
    from trainthrough.engines.gloo.port import ControllerPort



class DistRecovery:
    """The controller's view of who is in the group, and what happens on a change."""

    def __init__(self, port: ControllerPort, orders: list[dict[str, Any]]) -> None:
        self.port, self.orders = port, orders
        cfg = port.cfg
        self.policy = group_recovery_policy(port.strategy.recovery)
        self.replacement = ReplacementPolicy(cfg.replace, cfg.recovery_delay)
        self.stragglers = StragglerPolicy(cfg.straggler_deadline)
        self.fences = Fences(port.emit)  # incarnations taken out of the group
        self.state = GroupState.NEW
        # STARTING: the processes spawned, and when.
        self.waiting: list[Proc] = []
        self.started_at = 0.0
        # From TRAINING on: attempt n's group, and the replacements waiting to join it.
        self.n, self.members = 0, list[int]()
        self.joiners: list[tuple[Proc, float]] = []
        self.change_requested = False  # the group was asked to stop after a step
        # Preemption: the ranks' notices; the job's own (stop with a just-in-time save),
        # once that stop plan is out the members it stopped and the step they held, and
        # whether it came because every member had a notice.
        self.drains = Drains()
        self.jit = False
        self.stopped: list[int] | None = None
        self.stop_logical = -1
        self.all_drained = False
        self.drained_at = 0.0
        self.reported = False  # a member announced a report (protocol.write_report)
        # REPORTING only: a report or a death (the group broke), and the first report
        # that its collective timed out.
        self.first_sign: float | None = None
        self.first_timeout: float | None = None
        # Any state: failures not yet matched to a decision, open recoveries, counters;
        # the ranks' own errors and the losses nobody injected.
        self.log = RecoveryLog(port, cfg.ranks)
        self.crashes = Crashes(cfg.max_restarts)

    # -- starting -----------------------------------------------------------------
    def start(self, slots: range | list[int], mode: str, attempt: int, executed: int,
              restore: int | None = None) -> None:
        """Spawn a process per slot; attempt ``attempt`` starts once all are ready."""
        ctl = self.port.store.add("ctl", 0)
        self.waiting = [self.port.procs.spawn(s, mode, attempt, executed, ctl,
                                           self._orders_for(s, executed),
                                           self.port.result.updates_applied, restore)
                        for s in slots]
        self._to(GroupState.STARTING)
        self.n, self.started_at = attempt, time.time()

    def _to(self, to: GroupState) -> None:
        """Go to state ``to``: the only place the state changes.

        Raises:
            GroupStateError: :data:`~.group_state.TRANSITIONS` has no such change.
        """
        if to not in TRANSITIONS[self.state]:
            allowed = ", ".join(sorted(s.value for s in TRANSITIONS[self.state])) or "none"
            raise GroupStateError(f"dist engine: the group cannot go from {self.state.value} "
                                  f"to {to.value} (from {self.state.value}: {allowed})")
        self.state = to

    def _publish(self, plan: Plan) -> None:
        """Write ``plan``, naming the incarnation of each member: the fencing token a
        process compares with its own (a stale one of the same slot is out)."""
        cur = self.port.procs.current
        write_plan(self.port.store, replace(plan, incs=[cur[s].inc for s in plan.members]))

    def _admitted(self, reports: dict[int, Report]) -> dict[int, Report]:
        """The reports written by the incarnation each slot has now; one from a fenced
        incarnation, or from another than the current, is refused (recorded once)."""
        cur = self.port.procs.current
        out = {}
        for s, r in reports.items():
            stale = s not in cur or r.inc != cur[s].inc or cur[s].fenced
            if stale:
                self.fences.refuse(s, r.inc, "report", key=f"report/{self.n}")
            else:
                out[s] = r
        return out

    def _orders_for(self, slot: int, executed: int) -> list[dict[str, Any]]:
        """Orders a new process of ``slot`` carries: all of the slot's pending ones.

        An order that fell due while the slot was down strikes the replacement at its
        first injection point, right after it joined (a failure during recovery), so a
        schedule's failures are all delivered, as the ray engine strikes a replacement
        that is still coming up.
        """
        return [o for o in self.orders if o["slot"] == slot]

    def finished(self) -> bool:
        """The members of the running attempt all ended cleanly: the run is over."""
        cur = self.port.procs.current
        # REPORTING too: the run ends with its members' clean exits, whatever came before.
        return (self.state in (GroupState.TRAINING, GroupState.REPORTING) and bool(self.members)
                and all(cur[s].exitcode == 0 for s in self.members))

    # -- every tick ---------------------------------------------------------------
    def tick(self) -> bool:
        """Advance the state machine; returns whether anything happened."""
        if self.state is GroupState.STARTING:
            ended = [p for p in self.waiting if p.exitcode is not None]
            if ended:
                self._last_words(ended[0])
                raise self.crashes.fatal(ended[0], "ended while starting")
            if time.time() - self.started_at > START_SECONDS:
                raise RuntimeError("dist engine: rank processes did not start within "
                                   f"{START_SECONDS:g} s")
            if not all(self.port.procs.ready(p) for p in self.waiting):
                return False
            self.members = sorted(p.slot for p in self.waiting)
            self._publish(Plan(self.n, self.members, "start"))
            self._to(GroupState.TRAINING)
            return True
        now = time.time()
        self._expire(now)
        # A process that left its group with a notice, or that a stop plan ended, ends
        # as it may: no failure.
        dead = [p for p in self.port.procs.newly_dead()
                if p.exitcode != 0 and not self.drains.gone(p)
                and not (self.stopped is not None and p.slot in self.stopped)]
        for p in dead:
            self._last_words(p)
        strays = [p for p in dead if p.slot not in self.members]
        if strays:
            raise self.crashes.fatal(strays[0], "ended before it joined")
        # Reports are read only once a member said it wrote one (a ``report`` event)
        # or a process ended: not N store round trips every tick.
        if not (self.reported or dead or self.state is GroupState.REPORTING):
            self._maybe_change()
            return False
        reports = self._admitted(read_reports(self.port.store, self.n, self.members))
        # With a relaxed sync the survivors find a loss only at their next outer step,
        # after up to H inner steps: a death starts the wait for their reports only if
        # nobody is left to report (a hung member is found by their collective timeout).
        relaxed = self.port.strategy.relaxed
        sign = reports or (dead and (not relaxed or not any(self.port.procs.alive(s)
                                                            for s in self.members)))
        if sign and self.state is GroupState.TRAINING:
            self._to(GroupState.REPORTING)
            self.first_sign = now
        timeout = self.port.cfg.cost.timeout_seconds
        if self.first_timeout is None and any(
                r.reason == "error" and timed_out(r.waited, timeout) for r in reports.values()):
            self.first_timeout = now
        if self.state is GroupState.REPORTING:
            expected = [s for s in self.members if self.port.procs.alive(s)]
            assert self.first_sign is not None
            deadline = report_deadline(self.first_sign, self.first_timeout, timeout)
            if all(s in reports for s in expected) or now > deadline:
                self._decide(reports)
                return True
        self._maybe_change()
        return bool(dead)

    def _last_words(self, p: Proc) -> None:
        """Read what ``p`` said as it ended on an error (rank_main): an error the user
        must fix ends the run here, in one line; any other is recorded and counted with
        the loss (crashes.py).

        Raises:
            UserError: the rank's error was the user's to fix (a loss not finite).
        """
        m = read_last_words(self.port.store, p.slot, p.inc)
        if m is not None and m.user is not None:
            raise UserError(m.user)
        if m is not None:
            self.port.emit(self.crashes.on_error(m))

    def on_event(self, m: Message) -> Event:
        """Bookkeeping for a message from the ranks (:meth:`.ledger.RecoveryLog.on_event`
        says which); a failure's order is spent. Returns the event the controller
        records for it.

        Raises:
            RuntimeError: a message of a kind the recovery does not handle.
        """
        if isinstance(m, Failed):
            for i, o in enumerate(self.orders):  # that order is spent
                if (o["slot"], o["spec"], o["phase"]) == (m.ids[0], m.spec, m.phase):
                    del self.orders[i]
                    break
        return self.log.on_event(m)

    # -- decisions ----------------------------------------------------------------
    def _decide(self, reports: dict[int, Report]) -> None:
        self.reported = False  # the next attempt's reports are announced anew
        # Whatever stopped the group answers a change asked for before it (a failure
        # re-forms it; a change is asked anew if still due): left set, no joiner would
        # ever be taken in after a failure that came while a change was pending.
        self.change_requested = False
        self.first_timeout = None
        # A victim posts its failure before it dies, and survivors report after: drain
        # once more, so the failure event is in even if it came within this tick.
        self.port.pump()
        now = time.time()
        procs = self.port.procs
        self.first_sign = None
        # Late for the deadline: reported, alive, but dropped (and replaced).
        late = self.stragglers.decide({s: r.waited for s, r in reports.items()
                                       if r.reason == "error"})
        reports = {s: r for s, r in reports.items() if s not in late}
        survivors = sorted(reports)
        failed = [s for s in self.members if s not in reports]
        hung = {s for s in failed if procs.alive(s)}
        for s in failed:  # hung, paused, late, ended: presumed failed, and fenced out
            p = procs.current[s]
            if p.exitcode is None and not p.fenced:
                self.fences.revoke(s, p.inc, "straggler" if s in late else "no-report")
            elif not self.fences.out(s, p.inc):
                # Said to have ended: the queue was drained above, so all it posted
                # before a real end is in; a host cut off writes on after the heal.
                self.fences.revoke(s, p.inc, "lost")
            procs.fence(p)
        errors = [r for r in reports.values() if r.reason == "error"]
        if not errors and not failed:
            self._change(reports)
            return
        victims = [e for e in self.log.fail_events if e.ids[0] in failed]
        self.log.fail_events = [e for e in self.log.fail_events if e not in victims]
        # A straggler was dropped from the collective its peers gave up on.
        struck = victims[0].phase_kind if victims else (
            errors[0].phase if late and errors else "boundary")
        phase = group_phase(struck)
        died = [t for s in failed if (t := procs.current[s].died_at) is not None]
        t_detect = min((r.t for r in errors), default=now)
        # An injected failure says when it struck; a loss nobody injected (a node gone)
        # is dated by its first sign: a death seen, or the first survivor's error.
        t_fail = victims[0].t if victims else min([*died, t_detect])
        self.log.t_detect = t_detect
        self.log.detections.append(t_detect - t_fail)
        # With no survivor, the victims' own last words say how far the run got.
        # An interrupted attempt counts as executed (as in sim); one not begun does not.
        executed = max([r.executed for r in reports.values()]
                       + [e.iteration + (e.phase != "boundary") for e in victims],
                       default=self.port.iteration)
        at_iteration = min((e.iteration for e in victims), default=executed)
        logical = max([r.logical for r in reports.values()]
                      + [e.logical for e in victims], default=self.port.logical)
        by_order = {e.ids[0] for e in victims}
        # A straggler dropped by the deadline is the policy's doing, not a crash.
        unexpected = [self.crashes.cause(procs.current[s], hung=s in hung)
                      for s in failed if s not in by_order and s not in late]
        if unexpected:  # a failure that repeats ends the run here, with its own error
            self.crashes.judge(unexpected, logical)
        done = min((r.buckets_done if r.phase == "allreduce" else 0 for r in errors), default=0)
        # A member's last collective may complete where another's failed (a ring's
        # last messages): those behind catch up with one that committed.
        behind = len({r.logical for r in reports.values()}) > 1
        d = self.policy.decide(GroupFailure(tuple(failed), len(survivors), phase,  # type: ignore[arg-type]
                                            done, self.port.saves.checkpointer.count > 0))
        self.port.emit(Detection(iteration=at_iteration, failed=[f"rank{i}" for i in failed],
                              detection_seconds=t_detect - t_fail, survivors=survivors))
        rec = OpenRecovery(failed, at_iteration, logical, t_fail, t_detect, d.action.value,
                           struck)
        self.log.open.append(rec)
        if d.action is RecoveryAction.ROLLBACK_ALL:
            rec.restart = True
            self._restart(survivors, executed, rec)
            return
        action = "rollback" if d.action is RecoveryAction.MINI_BATCH_ROLLBACK else "lossy"
        self.n += 1
        rec.n = self.n
        self.members = survivors
        self._publish(Plan(self.n, survivors, action,
                                      complete=d.complete_step and not behind,
                                      buckets_done=done,
                                      # relaxed: the survivors went on with inner steps
                                      uncount=phase == "boundary" and not self.port.strategy.relaxed,
                                      sync=behind, logical=logical))
        self._to(GroupState.TRAINING)
        self.log.reforms += 1
        self.log.smallest = min(self.log.smallest, len(survivors))
        join = self.replacement.decide(tuple(failed), now)
        if join is not None:
            ctl = self.port.store.add("ctl", 0)
            for s in join.slots:  # warm now, join once the delay is over
                p = procs.spawn(s, "join", -1, executed, ctl, self._orders_for(s, executed))
                self.joiners.append((p, join.at_seconds))

    def _restart(self, survivors: list[int], executed: int, rec: OpenRecovery) -> None:
        """Checkpoint-restart: every process leaves; fresh ones all load the checkpoint
        chosen here, once."""
        procs, e = self.port.procs, self.port
        self.n += 1
        self._publish(Plan(self.n, survivors, "exit"))
        procs.wait_exit([procs.current[s] for s in survivors]
                        + [p for p, _ in self.joiners], timeout=10)
        e.pump()  # the first survivor's replica before the interrupted step, if it sent it
        self.joiners, self.change_requested = [], False
        self.log.restarts += 1
        step, rec.perturbation = e.saves.choose(
            lambda msg: e.emit(CheckpointCorrupt(message=msg)))
        restored = rec.restored_from = 0 if step is None else step
        e.result.updates_lost += (rec.logical - restored) * e.cfg.ranks
        e.emit(Restored(step=restored))
        self.start(range(e.cfg.ranks), "restart", attempt=self.n + 1, executed=executed,
                   restore=step)

    def _maybe_change(self) -> None:
        """Ask the group to stop after a step (``ctl``) if a joiner is due, a member has
        a preemption notice, or the job is to stop with a just-in-time save."""
        if self.change_requested or self.port.stopping or self.stopped is not None:
            return
        now = time.time()
        grow = any(at <= now and self.port.procs.ready(p) for p, at in self.joiners)
        leaving = self.drains.leaving(self.members)
        if len(leaving) == len(self.members) and self.joiners \
                and self.port.saves.saver is None:
            # Every member has a notice, a replacement is on its way and there is no
            # checkpoint to save to: stopping now would lose the whole run, so the
            # members train on until a joiner is ready to take the state from them.
            leaving = []
        if grow or self.jit or leaving:
            self.change_requested = True
            request(self.port.store)

    def _change(self, reports: dict[int, Report]) -> None:
        """Everyone stopped at a step boundary because we asked: take the joiners in, let
        the members with a preemption notice go, or stop with a just-in-time save."""
        now = time.time()
        survivors = sorted(reports)
        # Timed from here, not from the request: a failure may have come in between.
        self.change_requested, self.log.t_grow = False, now
        logical = max(r.logical for r in reports.values())
        leaving = self.drains.leaving(survivors)
        stay = [s for s in survivors if s not in leaving]
        ready = [p for p, at in self.joiners if at <= now and self.port.procs.ready(p)]
        self.n += 1
        if self.jit or not (stay or ready):  # a joiner takes the state from a member
            # Nobody would be left (or the job got its notice): every member holds the
            # last committed step, and one writes it before all stop.
            if not self.jit:  # every member had a notice: the job's, from the first
                self.all_drained = True
                self.drained_at = min(self.drains.notices[s].message.t for s in leaving)
            self.jit, self.stopped, self.stop_logical = True, survivors, logical
            self.members = []
            saver = self.port.procs.current[survivors[0]]
            self._publish(Plan(self.n, [], "stop", save=saver.slot, save_inc=saver.inc))
            self._to(GroupState.TRAINING)
            return
        self.joiners = [(p, at) for p, at in self.joiners if p not in ready]
        self.log.last_joined = [p.slot for p in ready]
        for p in ready:
            self.port.store.set(f"join/{p.slot}/{p.inc}", str(self.n))
        if not stay:
            # Every member has a notice but replacements are ready: the leavers take
            # them in (they hold the state a joiner receives) and leave at the next
            # boundary, which the notices still pending ask for (_maybe_change).
            stay, leaving = survivors, []
        self.members = sorted(stay + [p.slot for p in ready])
        self._publish(Plan(self.n, self.members, "join" if ready else "start"))
        self._to(GroupState.TRAINING)
        if leaving:
            self._drained(leaving, logical, max(r.executed for r in reports.values()), now)

    def _drained(self, leaving: list[int], logical: int, executed: int, now: float) -> None:
        """``leaving`` left at the step boundary after ``logical``: say so, and spawn
        their replacements as for a loss (ReplacementPolicy)."""
        self.drains.left(leaving)
        self.log.smallest = min(self.log.smallest, len(self.members))
        self.port.emit(Drained(slots=leaving, logical=logical, ranks=list(self.members),
                               n=self.n))
        join = self.replacement.decide(tuple(leaving), now)
        if join is not None:
            ctl = self.port.store.add("ctl", 0)
            for s in join.slots:  # warm now, join once the delay is over
                p = self.port.procs.spawn(s, "join", -1, executed, ctl,
                                          self._orders_for(s, executed))
                self.joiners.append((p, join.at_seconds))

    # -- preemption ---------------------------------------------------------------
    def on_notice(self, m: Noticed) -> None:
        """A rank process got its preemption notice: it leaves after the group's next
        stop (:meth:`_maybe_change` asks for one)."""
        p = self.port.procs.current.get(m.slot)
        if p is None or p.inc != m.inc or p.exitcode is not None:
            return  # an incarnation that is gone already
        self.drains.add(p, m)
        self.port.emit(PreemptNotice(slot=m.slot, pid=m.pid, logical=m.logical,
                                     source="injected" if m.spec else "signal", spec=m.spec,
                                     notice_seconds=m.notice_seconds))

    def stop_with_save(self) -> bool:
        """The job got its notice: stop the group after a step, one member saving it.
        Returns whether there is a group to stop (not while processes start)."""
        if self.state not in (GroupState.TRAINING, GroupState.REPORTING) or not self.members:
            return False
        self.jit = True
        self._maybe_change()
        return True

    def stop_done(self) -> bool:
        """The stop plan is out and every member it stopped has ended."""
        cur = self.port.procs.current
        return self.stopped is not None and all(cur[s].exitcode is not None
                                                for s in self.stopped)

    def _expire(self, now: float) -> None:
        """SIGKILL the ranks whose injected notice ran out before they left: a member's
        loss is then recovered like a crash, by the order that preempted it."""
        for n in self.drains.expired(now):
            p, m = n.proc, n.message
            if self.port.procs.current.get(p.slot) is p and p.slot in self.members:
                self.port.emit(PreemptExpired(slot=p.slot, pid=m.pid,
                                              notice_seconds=m.notice_seconds or 0.0))
                self.log.fail_events.append(Failed(
                    ids=[p.slot], spec=m.spec or "", phase="boundary", phase_kind="boundary",
                    # as far as it is known to have got: its notice's step, or later
                    iteration=max(self.port.iteration, m.logical),
                    logical=max(self.port.logical, m.logical), mode="preempt", pid=m.pid))
            self.port.procs.kill(p)
