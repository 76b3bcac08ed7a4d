"""What the ``dist`` controller's recoveries did: counters, timings, open recoveries.

:class:`RecoveryLog` turns the ranks' recovery messages (:mod:`.messages`) into the run's
events and counters; :class:`~.recovery.DistRecovery` decides and writes here what it
decided (an :class:`~.group_state.OpenRecovery` stays open until the group's first commit
after it, a :class:`~.messages.Resumed`). The controller reads the counters into the
run's result at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainthrough.engines.gloo.group_state import OpenRecovery
from trainthrough.engines.gloo.messages import (
    Failed,
    Message,
    Reformed,
    Resumed,
    StepCompleted,
)
from trainthrough.engines.signals import note_injected
from trainthrough.events import (
    Completed,
    Event,
    Failure,
    RankJoined,
    Recovery,
    RecoveryEnded,
    Reform,
    TrainingResumed,
)

if TYPE_CHECKING:
    from trainthrough.engines.gloo.port import ControllerPort


class RecoveryLog:
    """The recoveries of one run, as the controller counts them."""

    def __init__(self, port: ControllerPort, ranks: int) -> None:
        self.port = port
        self.fail_events: list[Failed] = []  # posted, not yet matched to a decision
        self.open: list[OpenRecovery] = []  # recoveries waiting for their first commit
        self.failures = self.reforms = self.restarts = self.joined = self.samples_dropped = 0
        self.smallest = ranks  # the fewest members a group had
        self.detections: list[float] = []
        self.reform_times: list[float] = []
        self.restart_times: list[float] = []
        self.join_times: list[float] = []
        self.t_detect = self.t_grow = 0.0  # the last decision's detection, the last grow
        self.last_joined: list[int] = []
        self.local_steps_lost: list[int] = []  # relaxed sync: per lost rank

    def on_event(self, m: Message) -> Event:
        """Bookkeeping for a message from the ranks (:class:`~.messages.Failed`,
        :class:`~.messages.Reformed`, :class:`~.messages.StepCompleted`,
        :class:`~.messages.Resumed`); returns the event the controller records for it.

        Raises:
            RuntimeError: a message of a kind the recovery does not handle.
        """
        t = m.t
        if isinstance(m, Failed) and m.mode == "preempt":
            # A notice, not a death: the rank leaves at a step boundary (recovery.py);
            # nothing is decided on it unless its notice runs out.
            self.failures += 1
            return Failure(kind=m.kind, ids=list(m.ids), spec=m.spec, phase=m.phase,
                           phase_kind=m.phase_kind, mode=m.mode, iteration=m.iteration,
                           logical=m.logical, pid=m.pid)
        if isinstance(m, Failed):
            self.failures += 1
            if m.mode != "slow":  # a slow rank loses nothing: no loss to match it to
                if m.pid:  # the rank struck itself: its death (or end) is this failure
                    note_injected(m.pid)
                self.fail_events.append(m)
            if m.local_steps is not None:
                self.local_steps_lost.append(m.local_steps)
            return Failure(kind=m.kind, ids=list(m.ids), spec=m.spec, phase=m.phase,
                           phase_kind=m.phase_kind, mode=m.mode, iteration=m.iteration,
                           logical=m.logical, pid=m.pid)
        if isinstance(m, Reformed) and m.action == "join":
            self.join_times.append(t - self.t_grow)
            self.joined += len(self.last_joined)
            return RankJoined(n=m.n, ranks=m.ranks, action="join",
                              join_seconds=t - self.t_grow, slots=self.last_joined,
                              bytes=m.state_bytes, transfer_seconds=m.transfer_seconds)
        if isinstance(m, Reformed):
            self.reform_times.append(t - self.t_detect)
            for rec in self.open:  # measured by the first member of the recovering group
                if rec.n == m.n and m.perturbation is not None:
                    rec.perturbation = m.perturbation
            return Reform(n=m.n, ranks=m.ranks, action=m.action,
                          reform_seconds=t - self.t_detect)
        if isinstance(m, StepCompleted):
            self.samples_dropped += m.samples_dropped
            self.port.result.updates_lost += len(self.open[-1].failed) if self.open else 0
            return Completed(micro_dropped=m.micro_dropped, samples_dropped=m.samples_dropped)
        if isinstance(m, Resumed):
            for rec in self.open:
                self._close(rec, t)
            self.open = []
            return TrainingResumed(iteration=m.iteration)
        raise RuntimeError(f"dist engine: a rank sent an unknown message {m.TYPE!r}")

    def awake(self, slot: int, spec: str) -> None:
        """A pause of ``slot`` ended before the group noticed it (the rank was still a
        member when it said so): its failure will never be matched to a loss."""
        self.fail_events = [e for e in self.fail_events
                            if not (e.ids[0] == slot and e.spec == spec and e.mode == "pause")]

    def _close(self, rec: OpenRecovery, t: float) -> None:
        if rec.restart:
            self.restart_times.append(t - rec.t_detect)
        # Unknown (NaN) if the attempt that carried it out broke before it reported.
        r = Recovery(failed=[f"rank{i}" for i in rec.failed], at_iteration=rec.iteration,
                     recovery_seconds=t - rec.t_fail, perturbation_norm=rec.perturbation,
                     action=rec.action, restored_from=rec.restored_from)
        self.port.result.recoveries.append(r)
        self.port.emit(RecoveryEnded(recovery=r, phase=rec.phase,
                                  detection_seconds=rec.t_detect - rec.t_fail))
